# pyhpc: `make` lists the targets. The two commands of the README are
# `make deploy` and `make test`; each works on its own on a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INVENTORY ?= ansible/inventories/lab
CLUSTER ?= $(INVENTORY)/cluster.yml
ANSIBLE_FLAGS ?=
PYTEST_FLAGS ?=
export ANSIBLE_CONFIG := $(CURDIR)/ansible/ansible.cfg
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# torch==2.13.0 must resolve to the machine's local CPU wheel where it has one,
# whatever the user's pip configuration says (PyPI's build pulls GBs of CUDA).
ifneq ($(wildcard /opt/wheels),)
export PIP_FIND_LINKS ?= /opt/wheels
endif

.PHONY: help venv venv-deploy deploy undeploy purge status lab-up test test-debs unit lint integration bench bench-deploy bench-deep bench-crash bench-takeover bench-hub bench-workshop bench-backup bench-hostlab bench-upgrade-hosts bench-upgrade-run bench-monitoring bench-gpu bench-page docs docs-pictures containers clean \
	hostlab hostlab-image hostlab-up hostlab-deploy hostlab-run hostlab-down debian-release upgrade-accounting

help: ## Print this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(VENV)/.stamp ## Create the virtualenv for tests and benchmarks (reruns only when requirements change).

venv-deploy: $(VENV)/.stamp-deploy ## The same virtualenv with only what a deploy needs (Ansible, the validator's imports).

# One virtualenv, two stamps: `make deploy` on a new machine installs requirements/deploy.txt
# and the roles' three collections (requirements/collections.yml), not the runtime and test
# tools of dev.txt (torch among them). A virtualenv made before that holds the whole
# `ansible` bundle: it is uninstalled first, as a new one never has it.
$(VENV)/.stamp-deploy: requirements/deploy.txt requirements/collections.yml requirements/install_collections.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements/deploy.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
	if $(PY) -m pip show -q ansible 2>/dev/null; then $(PY) -m pip uninstall -q -y ansible; fi
	$(PY) -I requirements/install_collections.py
	$(PY) -m pip install -q --no-deps -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(PY) -c "import ansible, pyhpc.cluster"
	touch $@

$(VENV)/.stamp: $(VENV)/.stamp-deploy requirements/runtime.txt requirements/dev.txt requirements/hub.txt requirements/singleuser.txt
	$(PY) -m pip install -q -r requirements/dev.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(PY) -c "import torch, submitit, ansible, pyhpc"
	touch $@

# What the tests drive besides the lab: a real headless browser for the pages (Debian's
# chromium and its driver; the browser tests fail without them, they do not skip).
TEST_DEBS := chromium chromium-driver openssh-client
test-debs: ## Install the Debian packages the tests need (chromium, chromium-driver, openssh-client for hostlab).
	@missing="$$(for p in $(TEST_DEBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done)"; \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq $$missing; fi

# Lint and unit tests use no lab and share no state: they run on one worker per CPU
# (pytest-xdist). The integration tests run on two workers: hostlab's modules in one and
# the lab's in the other, each in order (tests/integration/conftest.py; the lab's `alone`
# tests first); a test marked `alone` (it measures what a quiet machine gives a job, or
# restarts the lab's daemons) runs while the other worker waits. INTEGRATION_WORKERS=0 runs them one at a time.
# Both parts always run.
CHECK_WORKERS ?= auto
INTEGRATION_WORKERS ?= 2
INTEGRATION := $(VENV)/bin/pytest $(PYTEST_FLAGS) -n $(INTEGRATION_WORKERS) --dist loadgroup tests/integration
test: venv test-debs lab-up ## Lint and unit tests (on every CPU), then the integration tests (deploys the lab first; idempotent when it is up).
	rc=0; $(VENV)/bin/pytest $(PYTEST_FLAGS) -n $(CHECK_WORKERS) tests/lint tests/unit || rc=$$?; \
	$(INTEGRATION) || rc=$$?; exit $$rc

unit: venv ## Unit tests only (no cluster needed; on every CPU); UPDATE_GOLDEN=1 accepts changed golden files.
	$(VENV)/bin/pytest $(PYTEST_FLAGS) -n $(CHECK_WORKERS) tests/unit

lint: venv ## ruff and strict mypy; yamllint, ansible syntax check and ansible-lint, hadolint, shellcheck.
	$(VENV)/bin/pytest $(PYTEST_FLAGS) -n $(CHECK_WORKERS) tests/lint

integration: venv lab-up ## Integration tests against the lab cluster (hostlab's and the lab's side by side).
	$(INTEGRATION)

DEPLOY_LOG ?= .deploy/deploy.log
ANSIBLE_PLAYBOOK := $(VENV)/bin/ansible-playbook -i $(INVENTORY)/hosts.yml -e pyhpc_cluster_file=$(abspath $(CLUSTER))

# site.yml's first play validates the definition (the deploy's one check) before any host changes.
deploy: venv-deploy ## Deploy the lab (or INVENTORY=dir for a real cluster; CLUSTER=file overrides its cluster.yml).
	@mkdir -p $(dir $(DEPLOY_LOG))
	@echo "=== make deploy INVENTORY=$(INVENTORY) CLUSTER=$(CLUSTER) ($$(date -u +%FT%TZ))" >> $(DEPLOY_LOG)
	$(ANSIBLE_PLAYBOOK) $(ANSIBLE_FLAGS) ansible/site.yml 2>&1 | tee -a $(DEPLOY_LOG)

undeploy: venv-deploy ## Every role absent: stop every pyhpc daemon; PURGE=1 also removes packages, state, database, keys, /opt/pyhpc/{venv,src}.
	@mkdir -p $(dir $(DEPLOY_LOG))
	$(ANSIBLE_PLAYBOOK) -e pyhpc_purge=$(if $(PURGE),true,false) $(ANSIBLE_FLAGS) ansible/undeploy.yml 2>&1 | tee .deploy/undeploy.log

# One step of the upgrade to Debian 13 (docs/admin/upgrades.md): HOSTS, an inventory
# pattern, move in place; PROXY=URL: apt fetches through a site's cache or proxy.
debian-release: venv-deploy ## Move HOSTS (db, then ctl, compute, login) in place to Debian 13; Slurm's daemons stay masked (PROXY=URL: apt through a cache).
	$(VENV)/bin/ansible-playbook -i $(INVENTORY)/hosts.yml -e debian_release_hosts='$(HOSTS)' \
		-e debian_release_apt_proxy='$(PROXY)' $(ANSIBLE_FLAGS) ansible/release.yml

upgrade-accounting: venv-deploy ## After the accounting host's move: convert its database for the new slurmdbd (a dump first; a failed step goes back to it), then start slurmdbd.
	$(VENV)/bin/ansible-playbook -i $(INVENTORY)/hosts.yml $(ANSIBLE_FLAGS) ansible/accounting.yml

status: venv ## Check the running cluster (pyhpc doctor): munge, slurmctld, slurmdbd, nodes, a 2-node job, sacct.
	$(PY) -m pyhpc doctor

# Always an (idempotent) deploy rather than "deploy if doctor fails": it also
# starts a daemon that died and syncs /opt/pyhpc/src, the copy jobs import pyhpc
# from, with this checkout; on a healthy lab it changes nothing (about 30 s).
lab-up: venv-deploy ## Bring the lab up (an idempotent deploy of the lab inventory).
	$(MAKE) --no-print-directory deploy INVENTORY=ansible/inventories/lab CLUSTER=ansible/inventories/lab/cluster.yml

bench-deploy: venv ## Benchmark: a clean clone's fresh deploy vs. a plain apt + pip install of the same sets, and the re-run (purges the lab; ~12 min); BENCH_DEPLOY_FLAGS=--cold as on a new machine.
	$(PY) -m benchmarks.deploy $(BENCH_DEPLOY_FLAGS)

bench-hostlab: venv ## Benchmark hostlab: image, hosts up, fresh deploy and re-run on 1-8 compute hosts (~30 min; restores it).
	$(PY) -m benchmarks.hostlab

bench-scale: venv lab-up ## Benchmark scale (4-64 nodes, 1,000 jobs, DDP start-up): benchmarks/results/scale.json, docs/scale-*.png (~30 min; redeploys the lab).
	$(PY) -m benchmarks.scale

bench-deep: venv lab-up ## Benchmark the deep model: pipeline stages vs unsplit, bubble (1F1B, GPipe), 1 vs 2 nodes, largest depth per stage count (~25 min).
	$(PY) -m benchmarks.deep

bench-crash: venv lab-up ## Benchmark the controller-crash window: accepted jobs that survive a slurmctld killed 0-30 s after a burst (~15 min; TARGET=hostlab for hostlab as it is up).
	$(PY) -m benchmarks.crash --target $(or $(TARGET),lab)

bench-upgrade-hosts: venv ## Benchmark hosts moved in place to Debian 13 on hostlab's Debian 12 hosts (HOSTLAB_RELEASE=bookworm make hostlab first): each host's time, apt's downloads, a package cache (~15 min; ends with hostlab-down).
	$(PY) -m benchmarks.upgrade_hosts

bench-upgrade-run: venv ## Benchmark the whole cluster moved to Debian 13 by pyhpc admin upgrade run on hostlab's Debian 12 cluster (HOSTLAB_RELEASE=bookworm make hostlab first): each step, each phase, the time no job can start (~10 min; ends with hostlab-down).
	$(PY) -m benchmarks.upgrade_run

bench-takeover: venv ## Benchmark a backup controller's takeover on hostlab as test_hostlab_takeover.py leaves it: ctl killed 3 times (~10 min).
	$(PY) -m benchmarks.takeover

bench-monitoring: venv lab-up ## Benchmark monitoring: training samples/s with and without it (ABBA), scrape cost at 4 and 68 nodes, Slurm commands per scrape (~20 min; redeploys the lab).
	$(PY) -m benchmarks.monitoring

bench-hub: venv lab-up ## Benchmark the hub: twenty participants start their servers at once, nodes declared with this machine's CPUs and with 16; how many run, time until they do, the hub's memory (~10 min; redeploys the lab).
	$(PY) -m benchmarks.hub

bench-workshop: venv lab-up ## Benchmark a day-one workshop: workshop create (and again) and delete of 200 participants, directory and accounting real (~3 min).
	$(PY) -m benchmarks.workshop

bench-backup: venv lab-up ## Benchmark backups per 10,000 job records: the accounting dump's size and time, the restore's load, verify's check, on scratch copies of the lab's accounting database (~1 min).
	$(PY) -m benchmarks.backup

bench-gpu: ## On a machine whose torch sees a GPU (not the lab): pyhpc bench, training fp32/bf16 vs its CPUs, the health check, NVML (~3 min; docs/benchmarks.md).
	$(PYTHON) -m benchmarks.gpu --out benchmarks/results

bench: venv lab-up ## Run the benchmarks on the lab; each writes benchmarks/results/<name>.json.
	$(PY) -m benchmarks.containers --from-scratch
	$(PY) -m benchmarks.jobs
	$(MAKE) --no-print-directory bench-deploy

bench-page: venv ## Render docs/benchmarks.md (the current figures) from benchmarks/results/*.json.
	$(PY) -m benchmarks.figures_page

# The docs site: mkdocs.yml, pages in docs/; built into build/site (never into docs/).
docs: venv ## Build the docs site with mkdocs --strict into build/site.
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

# The browser tests save their screenshots in build/screenshots; the pictures in docs/
# change only when an admin copies them there.
docs-pictures: ## Copy the browser tests' screenshots (build/screenshots/*.png, from make test) into docs/.
	@ls build/screenshots/*.png >/dev/null 2>&1 || { echo "no screenshots in build/screenshots: run the hub and monitoring tests first"; exit 1; }
	cp -v build/screenshots/*.png docs/

containers: venv ## Build the CPU framework image offline (podman) into /opt/pyhpc/images; a no-op when the spec is unchanged.
	$(PY) -m pyhpc containers build --variant cpu

clean: ## Remove caches and build outputs in this checkout (not the venv, the lab or images).
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build containers/build benchmarks/work *.egg-info
	find . -name __pycache__ -type d -not -path './.venv/*' -prune -exec rm -rf {} +

purge: ## Same as `make undeploy PURGE=1`: stop daemons, purge packages, state, database and keys.
	$(MAKE) --no-print-directory undeploy PURGE=1

# hostlab: an emulated multi-host cluster on this machine, one podman container
# per host of ansible/inventories/hostlab/hosts.yml with systemd as PID 1
# (hostlab/hostlab.py). Needs root, podman, netavark, aardvark-dns, mmdebstrap, ssh;
# runs with the system python3 (PyYAML), not the venv.
HOSTLAB := $(PYTHON) hostlab/hostlab.py
HOSTLAB_RELEASE ?= trixie
# Another topology: a copy of ansible/inventories/hostlab with other hosts and cluster.yml.
HOSTLAB_INVENTORY ?= ansible/inventories/hostlab
export HOSTLAB_RELEASE HOSTLAB_INVENTORY

hostlab: ## hostlab-image + hostlab-up + hostlab-deploy: a multi-host Slurm cluster on this machine.
	$(MAKE) --no-print-directory hostlab-image
	$(MAKE) --no-print-directory hostlab-up
	$(MAKE) --no-print-directory hostlab-deploy

hostlab-deploy: venv-deploy ## Run ansible/site.yml against the hostlab hosts (as `make deploy` does a real cluster's).
	$(MAKE) --no-print-directory deploy INVENTORY=$(HOSTLAB_INVENTORY) \
		CLUSTER=$(HOSTLAB_INVENTORY)/cluster.yml DEPLOY_LOG=.deploy/hostlab-deploy.log

hostlab-image: ## Build the hostlab host image once per recipe (HOSTLAB_RELEASE=trixie|bookworm).
	$(HOSTLAB) image

hostlab-up: ## Start the hostlab hosts (idempotent: running hosts are left alone); waits until booted.
	$(HOSTLAB) up

hostlab-run: export HOSTLAB_HOST := $(value HOST)
hostlab-run: export HOSTLAB_CMD := $(value CMD)
hostlab-run: ## Run CMD on a hostlab host: make hostlab-run HOST=login CMD='hostname'; no CMD: a shell.
	$(HOSTLAB) run "$$HOSTLAB_HOST" $(if $(value CMD),-- bash -c "$$HOSTLAB_CMD")

hostlab-down: ## Remove the hostlab hosts and network; PURGE=1 also their volumes and the image.
	$(HOSTLAB) down $(if $(PURGE),--purge)
