"""pyhpc.deploy.user: ansible.builtin.user, an existing account as asked checked by one getent
instead of a module run (plugin_utils/accounts.py); every change is the module's."""
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.accounts import UserAction as ActionModule

__all__ = ["ActionModule"]
