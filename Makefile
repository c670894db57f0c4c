# The two commands a user needs (each sets up the virtual environment on
# first use):
#   make demo   compares every method on the embedded digits task (3 seeds)
#   make test   runs the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: setup demo test lint build-files bazel gpu-setup gpu-check pytorch-setup clean-venv data-fmnist fmnist

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), \
	  f"tff_methods needs Python 3.11 (TFF 0.87), not {sys.version}"'
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	# TFF 0.87.0 pins jax/jaxlib 0.4.14, which the registry does not serve:
	# its other dependencies come from requirements.txt (jax 0.4.13).
	$(VENV)/bin/pip install --quiet --no-deps tensorflow-federated==0.87.0
	# The repository itself, editable: its packages under the names they
	# install as (tasks/ is tff_methods_tasks, pyproject.toml), edits apply
	# at once, and the commands tff-methods-* are in .venv/bin.
	$(VENV)/bin/python -c 'import os, sysconfig; p = os.path.join( \
	  sysconfig.get_paths()["purelib"], "tff_methods_repository.pth"); \
	  os.path.exists(p) and os.remove(p)'  # An older set-up's path entry.
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

# Settings and how they were chosen: demo/README.md. One intra-op thread
# per TensorFlow: the small model gains nothing from splitting an op, and
# the two jobs fill the two cores (12% less wall time on 2 cores).
demo: $(STAMP)
	TF_NUM_INTRAOP_THREADS=1 $(VENV)/bin/python -m binaries.compare \
	  --task=digits \
	  --partition=pathological --classes_per_client=2 --num_clients=10 \
	  --clients_per_round=10 --rounds=60 --local_epochs=2 \
	  --seeds=0,1,2 --settings_from=demo/tuning.json --reference_rows \
	  --last_rounds=5 --jobs=2 --rounds_per_checkpoint=60 \
	  --output_dir=runs/demo_compare

# Fashion-MNIST without a network: Debian's dataset-fashion-mnist (the
# original idx files, MIT licence, Zalando SE), downloaded and unpacked
# without root into data/fashion-mnist, where --task=fmnist finds it.
FMNIST_DIR := data/fashion-mnist
data-fmnist:
	@if [ -f $(FMNIST_DIR)/t10k-labels-idx1-ubyte.gz ]; then \
	  echo "Fashion-MNIST is in $(FMNIST_DIR)"; \
	elif command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then \
	  work=$$(mktemp -d) && cd $$work && \
	  apt-get download dataset-fashion-mnist && \
	  dpkg-deb -x dataset-fashion-mnist_*.deb unpacked && \
	  mkdir -p $(CURDIR)/$(FMNIST_DIR) && \
	  cp unpacked/usr/share/datasets/fashion-mnist/*-ubyte.gz \
	    $(CURDIR)/$(FMNIST_DIR)/ && \
	  cd $(CURDIR) && rm -rf $$work && \
	  echo "Fashion-MNIST unpacked into $(FMNIST_DIR)"; \
	else \
	  echo "No apt-get here: put Fashion-MNIST's four idx files" \
	    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz," \
	    "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz, from" \
	    "github.com/zalandoresearch/fashion-mnist) in $(FMNIST_DIR)," \
	    "or give their directory as --data_dir." >&2; exit 1; \
	fi

# Every method on the real Fashion-MNIST (docs/fmnist.md): 10 clients,
# Dirichlet(0.5) label skew, 3 seeds, learning rates tuned on held-out data
# (demo/fmnist/README.md). About 40 minutes on 2 cores.
fmnist: $(STAMP) data-fmnist
	TF_NUM_INTRAOP_THREADS=1 $(VENV)/bin/python -m binaries.compare \
	  --task=fmnist \
	  --partition=dirichlet --alpha=0.5 --num_clients=10 \
	  --clients_per_round=10 --rounds=50 --local_steps=20 --batch_size=32 \
	  --seeds=0,1,2 --settings_from=demo/fmnist/tuning.json --reference_rows \
	  --last_rounds=5 --jobs=2 --rounds_per_checkpoint=50 \
	  --output_dir=runs/fmnist_compare

# Three test processes on two cores: a test often waits on a binary or a
# worker it started.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -rs -n 3 --dist worksteal

# Google's Python style, as ruff checks and formats it (pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The Bazel BUILD files, written from the sources' imports (run it after
# adding a module or an import; tests/build_files_test.py checks them).
build-files:
	$(PYTHON) tools/build_files.py

# Bazel, offline (Bazel 4's native py rules; Debian's bazel-bootstrap): every
# target builds, and two test targets run their tests with .venv's Python.
# `bazel test //tests/...` runs the whole suite the same way.
BAZEL_TESTS ?= //tests/algorithms:fedprox_test //tests/algorithms:similarity_test
bazel: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bazel build //...
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bazel test $(BAZEL_TESTS)

# GPUs: TensorFlow's CUDA libraries into .venv (about 3 GB), then whether
# and how fast the GPUs run a round, beside TFF's CPU worker
# (docs/devices.md). GPU_CHECK_FLAGS adds flags, e.g. --methods=fedavg,moon.
GPU_STAMP := $(VENV)/.installed-gpu
$(GPU_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet 'tensorflow[and-cuda]==2.14.1'
	touch $(GPU_STAMP)

gpu-setup: $(GPU_STAMP)

gpu-check: $(GPU_STAMP)
	$(VENV)/bin/python -m binaries.device_check $(GPU_CHECK_FLAGS)

# PyTorch, for the benchmark's reference loops (tff_methods_tooling.
# pytorch_loop) and their tests: a virtual environment of its own, since
# current torch does not install beside TensorFlow 2.14 (about 5 GB).
PYTORCH_VENV := $(VENV)/torch
pytorch-setup:
	test -x $(PYTORCH_VENV)/bin/python || $(PYTHON) -m venv $(PYTORCH_VENV)
	$(PYTORCH_VENV)/bin/pip install --quiet torch numpy

clean-venv:
	rm -rf $(VENV)
