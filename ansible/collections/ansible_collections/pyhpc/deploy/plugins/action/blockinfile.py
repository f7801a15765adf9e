"""pyhpc.deploy.blockinfile: ansible.builtin.blockinfile, a file already as asked checked from one read
of it instead of a module run (plugin_utils/edits.py); every edit is the module's."""
from ansible_collections.pyhpc.deploy.plugins.plugin_utils import edits, probed

ActionModule = probed.edit_action("blockinfile", edits.blockinfile)
