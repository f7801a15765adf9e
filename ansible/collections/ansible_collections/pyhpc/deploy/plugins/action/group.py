"""pyhpc.deploy.group: ansible.builtin.group, an existing account as asked checked by one getent
instead of a module run (plugin_utils/accounts.py); every change is the module's."""
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.accounts import GroupAction as ActionModule

__all__ = ["ActionModule"]
