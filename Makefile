# sm120-serve: the two commands are `make lab` (converge the local lab) and `make test`
# (everything CI runs). Each does its own set-up on a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        := .venv
SGLANG_VENV := .venv-sglang
PY          := $(VENV)/bin/python
ACTIVATE    := source $(VENV)/bin/activate
LABCTL      := $(PY) molecule/lab/labctl.py
APT_PACKAGES := debootstrap systemd-container openssh-client rsync nftables libibverbs1 ibverbs-providers
export UV_CACHE_DIR := $(CURDIR)/.cache/uv
export ANSIBLE_HOME := $(CURDIR)/.cache/ansible
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Bytecode caches on, whatever the runner's environment says: each test process imports
# SGLang, torch and transformers, and without cached bytecode one `import sglang` spends
# about 15 s of its 28 s compiling on a 2-core runner.
unexport PYTHONDONTWRITEBYTECODE
# promtool and prometheus for the rule and dashboard tests, unpacked from Debian's package
# (not installed: the controller runs no Prometheus service).
PROMETHEUS_DEB_VERSION := 2.42.0+ds-5+deb12u1
PROMETHEUS_BIN_DIR     := $(CURDIR)/.cache/prometheus-deb/usr/bin
# for the monitoring tests and the tarball_service scenario (it packs these)
export SM120_PROMETHEUS_BIN_DIR := $(PROMETHEUS_BIN_DIR)
# The node exporter and Alertmanager (with amtool) of Debian's pinned packages, which the
# tarball_service scenario packs as release archives (GitHub is not reachable here).
MONITORING_DEBS    := prometheus-node-exporter=1.5.0-1+b6 prometheus-alertmanager=0.25.0-1+b4
MONITORING_BIN_DIR := $(CURDIR)/.cache/monitoring-deb/usr/bin
export SM120_MONITORING_BIN_DIR := $(MONITORING_BIN_DIR)

# Role scenarios (roles/<role>/molecule/*) and the scenarios of the whole deployment (molecule/<name>).
ROLE_DIRS        = $(sort $(foreach f,$(wildcard roles/*/molecule/*/molecule.yml),roles/$(word 2,$(subst /, ,$(f)))))
SITE_SCENARIOS   = $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))

step = @printf '\n\033[1m==> %s\033[0m  (%s)\n' "$(1)" "$$(date -u +%T)"

# The test report: every step of `make test` records its result, start, duration and group
# as JUnit XML in SM120_REPORT_DIR (.ci/step.py), with its log beside it; pytest adds its own
# JUnit file per step. `make test` prints the table of it at the end (.ci/report.py) and
# .ci/failure_summary.py reads it.
export SM120_REPORT_DIR := $(CURDIR)/.cache/reports
# $(call run_step,NAME[,GROUP]): the rest of the recipe line runs as step NAME of the report
# (GROUP: default $SM120_STEP_GROUP, which `make test` sets to its phase)
run_step = python3 $(CURDIR)/.ci/step.py $(if $(2),--group '$(2)') $(1) --
# $(call sh_step,NAME): likewise for a shell command line, quoted after it
sh_step = $(call run_step,$(1)) bash -euo pipefail -c
# $(call junit,NAME): pytest's JUnit report for step NAME, where .ci/step.py looks for it
junit = --junitxml=$(SM120_REPORT_DIR)/pytest/$(1).xml

# One `molecule test`, as step $(3) of the report in a lane: $(1) the directory it runs in,
# $(2) its arguments. Ansible's junit callback adds each playbook run of it (every task's
# result and duration) under ansible/$(3)/ of the report: on the grafana scenario its CPU
# cost was within the noise (33 and 37 s of CPU in two runs with it, 35 s without). The
# variable replaces callbacks_enabled of .config/molecule/config.yml, hence profile_tasks.
molecule_test = printf '\n\033[1m==> molecule test %s in %s\033[0m\n' '$(2)' '$(1)'; \
  rm -rf $(SM120_REPORT_DIR)/ansible/$(3); \
  cd $(1) && PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
  ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks,ansible.builtin.junit \
  JUNIT_OUTPUT_DIR=$(SM120_REPORT_DIR)/ansible/$(3) JUNIT_HIDE_TASK_ARGUMENTS=true \
  $(call run_step,$(3),lane) molecule test $(2)

.PHONY: help setup apt venv sglang-venv rootfs lab lab-destroy lint test test-static \
        test-unit test-drafts test-background test-kernels test-kernels-compiler test-kernels-interpreter test-monitoring test-recipes test-lab test-roles test-site test-scenario clean prometheus-bin \
        monitoring-bin

help:
	@echo "make lab          converge the local lab (gpu-node + monitor) with site.yml"
	@echo "make test         everything CI runs: static checks, kernels on CPU, Molecule"
	@echo "make lint         static checks only"
	@echo "make lab-destroy  remove the lab hosts"
	@echo "make setup        apt packages, the controller venv and the lab root filesystems"

setup: apt venv rootfs

apt: .cache/apt.stamp
.cache/apt.stamp:
	$(call step,apt packages: $(APT_PACKAGES))
	@mkdir -p .cache
	@$(call sh_step,apt) 'if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; fi'
	@touch $@

# pip installs only the pinned uv, and uv the rest: pip unpacks one file at a time, and
# the ansible package alone is some 30,000 files.
venv: $(VENV)/.stamp
$(VENV)/.stamp: requirements/controller.txt
	$(call step,controller venv ($(VENV)) from requirements/controller.txt)
	@$(call sh_step,venv) 'python3 -m venv $(VENV); \
	  $(VENV)/bin/pip install -q "$$(grep -E "^uv==" requirements/controller.txt)"; \
	  $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python -r requirements/controller.txt'
	@touch $@

# The pinned SGLang stack from its hashed lock, plus test-only tools: CPU kernel tests,
# the plugin test and the metric-name checks run against the real packages.
sglang-venv: $(SGLANG_VENV)/.stamp
$(SGLANG_VENV)/.stamp: files/sglang/requirements.lock requirements/kernels-test.txt $(VENV)/.stamp
	$(call step,SGLang venv ($(SGLANG_VENV)) from files/sglang/requirements.lock)
	@$(call sh_step,sglang-venv) '[ -x $(SGLANG_VENV)/bin/python ] || $(VENV)/bin/uv venv -q --python python3.11 $(SGLANG_VENV); \
	  $(VENV)/bin/uv pip sync -q --python $(SGLANG_VENV)/bin/python --require-hashes files/sglang/requirements.lock; \
	  $(VENV)/bin/uv pip install -q --python $(SGLANG_VENV)/bin/python -r requirements/kernels-test.txt'
	@touch $@

# Both at once: debootstrap mostly waits on the archive and the disk.
rootfs: apt venv
	$(call step,lab root filesystems (Debian 12 and 13; cached))
	@$(call sh_step,rootfs) '$(LABCTL) rootfs bookworm >/dev/null & bookworm=$$!; $(LABCTL) rootfs trixie >/dev/null & trixie=$$!; \
	  failed=0; wait $$bookworm || failed=1; wait $$trixie || failed=1; exit $$failed'

# ---------------------------------------------------------------------------- the lab
lab: setup
	$(call step,lab hosts from inventory/lab)
	@$(LABCTL) up-inventory inventory/lab/hosts.yml >/dev/null
	$(call step,lab wiring: the engine stand-in replaces the GPU engine process (test double))
	@$(ACTIVATE) && ansible-playbook -i inventory/lab molecule/lab/standin.yml
	$(call step,ansible-playbook site.yml on the lab)
	@$(ACTIVATE) && ansible-playbook -i inventory/lab site.yml
	$(call step,lab check: requests through the router; every target up; every query with data)
	@$(ACTIVATE) && ansible-playbook -i inventory/lab molecule/lab/check.yml

lab-destroy: venv
	$(call step,removing the lab hosts)
	@$(LABCTL) down --all
	@$(LABCTL) check-clean >/dev/null && echo "lab removed: no host, process or mount left"

# ---------------------------------------------------------------------------- tests
lint test-static: venv
	$(call step,yamllint)
	@$(ACTIVATE) && $(call run_step,yamllint) yamllint --strict .
	$(call step,ansible-lint (production profile))
	@$(ACTIVATE) && $(call run_step,ansible-lint) ansible-lint --profile production
	$(call step,syntax check of every playbook)
	@$(ACTIVATE) && $(call sh_step,syntax-check) 'failed=0; for pb in site.yml rollback.yml bench.yml playbooks/*.yml; do \
	  if ansible-playbook -i inventory/lab --syntax-check "$$pb" >/dev/null; then echo "ok  $$pb"; else failed=1; fi; done; \
	  exit $$failed'
	$(call step,role defaults match meta/argument_specs.yml)
	@$(ACTIVATE) && $(call run_step,static-tests) python -m pytest -q tests/static $(call junit,static-tests)

test-kernels: sglang-venv
	$(call step,kernels on CPU: Triton interpreter; sm_120 cross-compile; SGLang plugin)
	@$(call run_step,kernels) bash files/kernels/scripts/test-cpu.sh $(CURDIR)/$(SGLANG_VENV)/bin/python

# With the kernel's autogroups every session gets an equal share of the CPU whatever its
# processes' nice values (each SSH login to a lab host is a session), so `make test` runs
# the checks beside the Molecule lanes in a session of their own, and that session nice 19.
test-kernels-compiler: sglang-venv
	$(call step,kernels on CPU: sm_120 cross-compile; SGLang plugin; packaging)
	@PYTEST_ADDOPTS="$${PYTEST_ADDOPTS:-} $(call junit,kernels-compiler)" $(call run_step,kernels-compiler) \
	  bash files/kernels/scripts/test-cpu.sh $(CURDIR)/$(SGLANG_VENV)/bin/python compiler

test-kernels-interpreter: sglang-venv
	$(call step,kernels on CPU: Triton interpreter against the torch references)
	@PYTEST_ADDOPTS="$${PYTEST_ADDOPTS:-} $(call junit,kernels-interpreter)" $(call run_step,kernels-interpreter) \
	  bash files/kernels/scripts/test-cpu.sh $(CURDIR)/$(SGLANG_VENV)/bin/python interpreter

# The checks `make test` runs beside the Molecule lanes (in its nice 19 session), one after
# another and every one whatever fails (-k), so the log names each failure; the interpreter
# tier last.
test-background: sglang-venv prometheus-bin
	@$(MAKE) --no-print-directory -k test-static test-unit test-drafts test-kernels-compiler test-monitoring test-recipes \
	  test-kernels-interpreter

# mooncake.engine (the PD transfer engine the validation imports) links libibverbs (apt).
test-recipes: sglang-venv apt
	$(call step,recipes: every shipped layout through SGLang's parser and resolution, against the models' config.json)
	@$(call run_step,recipes-check) $(SGLANG_VENV)/bin/python tests/recipes/check_recipes.py
	$(call step,release validation: what each engine loads at start; refusals of a missing package, parser or model class)
	@$(call run_step,recipes-validation) $(SGLANG_VENV)/bin/python -m pytest -q -p no:warnings tests/recipes \
	  $(call junit,recipes-validation)

test-unit: venv
	$(call step,unit tests of the roles' plugins and scripts)
	@$(ACTIVATE) && $(call run_step,unit-tests) python -m pytest -q tests/unit $(call junit,unit-tests)

test-drafts: sglang-venv
	$(call step,EAGLE-3 drafts: tensor names and shapes against the classes SGLang 0.5.23 loads them with)
	@$(call run_step,drafts) $(SGLANG_VENV)/bin/python -m pytest -q tests/drafts $(call junit,drafts)

prometheus-bin: $(PROMETHEUS_BIN_DIR)/promtool
$(PROMETHEUS_BIN_DIR)/promtool: | apt
	$(call step,promtool $(PROMETHEUS_DEB_VERSION) from Debian's prometheus package)
	@$(call sh_step,prometheus-bin) 'rm -rf .cache/prometheus-deb && mkdir -p .cache/prometheus-deb; \
	  (cd .cache && apt-get download -qq prometheus=$(PROMETHEUS_DEB_VERSION)); \
	  dpkg-deb -x .cache/prometheus_$(subst :,%3a,$(PROMETHEUS_DEB_VERSION))_amd64.deb .cache/prometheus-deb; \
	  rm -f .cache/prometheus_*.deb'

monitoring-bin: $(MONITORING_BIN_DIR)/amtool
$(MONITORING_BIN_DIR)/amtool: | apt
	$(call step,node exporter and Alertmanager binaries from Debian's packages ($(MONITORING_DEBS)))
	@$(call sh_step,monitoring-bin) 'rm -rf .cache/monitoring-deb && mkdir -p .cache/monitoring-deb/debs; \
	  (cd .cache/monitoring-deb/debs && apt-get download -qq $(MONITORING_DEBS)); \
	  for deb in .cache/monitoring-deb/debs/*.deb; do dpkg-deb -x "$$deb" .cache/monitoring-deb; done; \
	  rm -rf .cache/monitoring-deb/debs'

test-monitoring: sglang-venv prometheus-bin
	$(call step,monitoring: promtool rule tests; dashboards; metric names in the pinned SGLang and router)
	@$(call run_step,monitoring) $(SGLANG_VENV)/bin/python -m pytest -q tests/monitoring $(call junit,monitoring)

test-lab: setup
	$(call step,lab lifecycle: boot; failed converge; destroy leaves nothing)
	@$(ACTIVATE) && $(call run_step,lab-lifecycle) python -m pytest -q tests/lab $(call junit,lab-lifecycle)

# Role scenarios run two at a time (ROLE_JOBS): each lab has its own hosts and addresses,
# and a scenario spends much of its time waiting on apt and systemd, so two lanes finish
# the set in about two thirds of the serial time on a 2-core runner. Longest first, so the
# lanes end together; each scenario's log is printed whole when it ends (make -O).
ROLE_JOBS  ?= 2
ROLE_ORDER := sglang_release preflight tarball_service nvidia_driver alertmanager prometheus gpu_exporter cuda_toolkit node_exporter grafana
ROLE_NAMES  = $(filter $(notdir $(ROLE_DIRS)),$(ROLE_ORDER)) $(filter-out $(ROLE_ORDER),$(notdir $(ROLE_DIRS)))

test-roles: setup prometheus-bin monitoring-bin
	@$(MAKE) --no-print-directory -j$(ROLE_JOBS) --output-sync=target $(addprefix molecule-role/,$(ROLE_NAMES))

molecule-role/%:
	@$(call molecule_test,roles/$*,--all,roles/$*)

test-scenario: setup
	@$(ACTIVATE) && molecule test -s $(S)

# Site scenarios (molecule/<name>) that `make test` runs, longest first: all but the lab.
SITE_ORDER := examples examples_multinode
SITE_RUN = $(filter $(SITE_SCENARIOS),$(SITE_ORDER)) $(filter-out lab $(SITE_ORDER),$(SITE_SCENARIOS))

test-site: setup
	@$(MAKE) --no-print-directory $(addprefix molecule-site/,$(SITE_RUN))

molecule-site/%:
	@$(call molecule_test,.,-s $*,molecule/$*)

# CI runs on 2 cores, and what bounds it is CPU time, so `make test` keeps both busy:
# - first what the lanes need (the venvs, the root filesystems, the monitoring binaries)
#   and the lab lifecycle test, which boots and removes its own hosts;
# - then two lanes, longest scenario first: the examples scenario in one, the multi-node
#   examples scenario and then the role scenarios in the other; the lane that ends first
#   takes the roles left. A third lane does not pay: beside two others a scenario takes
#   nearly twice as long. But two lanes leave CPU idle while they wait on health gates,
#   restarts and timeouts: the checks that need no lab host (static, unit, recipes,
#   monitoring, both kernel tiers) run beside them in a session of their own at nice 19
#   (test-background) and take only that idle time. A failed lane stops them too.
# Each step is recorded in the test report, whose table ends the output, passed or failed.
MOLECULE_JOBS ?= 2
test:
	@python3 .ci/report.py start
	@SM120_STEP_GROUP='first phase' $(MAKE) --no-print-directory -j4 --output-sync=target \
	  setup sglang-venv prometheus-bin monitoring-bin test-lab || { python3 .ci/report.py finish; exit 2; }
	@# a background job of this shell leads no process group, so setsid runs in place: its pid
	@# is the session's, which a failed lane kills whole
	@setsid bash -c '{ echo 19 > /proc/self/autogroup; } 2>/dev/null; export SM120_STEP_GROUP=background; \
	  exec nice -n 19 $(MAKE) --no-print-directory test-background' > .cache/background.log 2>&1 & background=$$!; \
	  lanes=0; $(MAKE) --no-print-directory -j$(MOLECULE_JOBS) --output-sync=target \
	    $(addprefix molecule-site/,$(SITE_RUN)) $(addprefix molecule-role/,$(ROLE_NAMES)) || lanes=$$?; \
	  if [ $$lanes -ne 0 ]; then kill -- -$$background 2>/dev/null || true; fi; \
	  checks=0; wait $$background || checks=$$?; cat .cache/background.log; \
	  python3 .ci/report.py finish; \
	  [ $$lanes -eq 0 ] && [ $$checks -eq 0 ]
	$(call step,all tests passed)

clean: lab-destroy
	rm -rf .cache/ansible
