# Ansible managed
# pyhpc's JupyterHub (ansible/roles/jupyterhub), read by the hub's user pyhpc-hub
# at start. No secret is in this file: the cookie secret and the tokens are files of the
# hub's own in /var/lib/pyhpc-hub (0600), read below.
import sys
from pathlib import Path

from pyhpc.hub import running
from pyhpc.hub.auth import PyhpcAuthenticator
from pyhpc.hub.spawner import PyhpcSlurmSpawner

c = get_config()  # noqa: F821 (traitlets' loader defines it)
STATE = Path("/var/lib/pyhpc-hub")


def secret(name):
    return (STATE / name).read_text().strip()


# The code this hub runs (pyhpc's modules, imported above): a deploy that changes it
# restarts the hub (pyhpc.hub.running).
running.record(STATE)

# Browsers: HTTPS at https://localhost:8000/. The proxy
# (Debian's configurable-http-proxy, started by the hub) terminates TLS; its own API
# listens on the loopback only, on a privileged port, behind a token.
c.JupyterHub.bind_url = "https://127.0.0.1:8000/"
c.JupyterHub.ssl_cert = "/etc/pyhpc/hub/tls/hub.crt"
c.JupyterHub.ssl_key = "/etc/pyhpc/hub/tls/hub.key"
c.ConfigurableHTTPProxy.command = ["configurable-http-proxy"]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:801"
c.ConfigurableHTTPProxy.auth_token = secret("proxy-token")

# Each user's server at its own origin, https://<user>.localhost:8000/
# (JupyterHub's guidance for users who do not trust each other): a page a user's server
# serves cannot reach the hub's cookies, the hub's API or another user's server, and
# the hub's cookies are __Host- ones, which no server of a subdomain can set for it.
# Needs *.localhost to reach this host (wildcard DNS; browsers resolve *.localhost
# themselves) and a certificate that names it (the generated one does; an admin's own must).
c.JupyterHub.subdomain_host = "https://localhost:8000"
c.JupyterHub.cookie_host_prefix_enabled = True

# The hub's API, where each notebook server (a job on a compute node) calls back: a
# privileged port, so no other user can answer the servers' token checks in its stead.
c.JupyterHub.hub_bind_url = "http://127.0.0.1:881"
c.JupyterHub.hub_connect_url = "http://127.0.0.1:881"

c.JupyterHub.cookie_secret_file = str(STATE / "cookie-secret")
c.JupyterHub.db_url = "sqlite:///" + str(STATE / "jupyterhub.sqlite")
# A hub restart (a changed configuration) leaves users' servers, their Slurm jobs, running;
# the hub finds them again.
c.JupyterHub.cleanup_servers = False
c.JupyterHub.allow_named_servers = False

# Logins: PAM's pyhpc-hub service (the directory's password, through nslcd). The allow
# rule is exactly "has a Slurm association" (PyhpcAuthenticator.check_allowed), checked
# again while a login lasts; nobody is a hub admin; users who no longer exist are dropped
# from the hub's database when it starts.
c.JupyterHub.authenticator_class = PyhpcAuthenticator
c.PyhpcAuthenticator.service = "pyhpc-hub"
c.PyhpcAuthenticator.open_sessions = False
c.PyhpcAuthenticator.local_users = ["root"]
c.Authenticator.allow_all = False
c.Authenticator.allow_existing_users = False
c.Authenticator.any_allow_config = True
c.Authenticator.admin_users = set()
c.Authenticator.delete_invalid_users = True
c.Authenticator.username_pattern = r"^[a-z_][a-z0-9_-]{0,31}$"

# Each user's server: a Slurm job of theirs (sudo -u USER sbatch, the sudo rule in
# /etc/sudoers.d/pyhpc-hub), from the job environment on every node.
c.JupyterHub.spawner_class = PyhpcSlurmSpawner
c.PyhpcSlurmSpawner.venv = "/opt/pyhpc/venv"
c.PyhpcSlurmSpawner.cluster_file = "/etc/pyhpc/cluster.yml"
c.PyhpcSlurmSpawner.idle_minutes = 60
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 120

# Services: the idle culler stops a server idle for 60 minutes; pyhpc-workshop
# is `pyhpc workshop delete` (root, with the token in /var/lib/pyhpc-hub), which
# may only delete users. my-jobs is each user's own jobs from Prometheus
# (pyhpc.monitor.my_jobs_page), at its own origin behind the hub's login, on the loopback and
# a privileged port (the hub's capability, which it inherits): every user may open it, and
# it shows each only their own.
c.JupyterHub.services = [
    {"name": "idle-culler",
     "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                 "--timeout=3600", "--cull-every=300"]},
    {"name": "pyhpc-workshop", "api_token": secret("workshop-token")},
    {"name": "my-jobs", "display": True, "oauth_no_confirm": True,
     "url": "http://127.0.0.1:882",
     "command": [sys.executable, "-P", "-m", "pyhpc.monitor.my_jobs_page",
                 "--scrape-interval=5s"]},
]
c.JupyterHub.load_roles = [
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
    {"name": "pyhpc-workshop", "services": ["pyhpc-workshop"], "scopes": ["delete:users"]},
    {"name": "user", "scopes": ["self", "access:services!service=my-jobs"]},
]
