# The README's two commands. Each installs what is missing (Debian packages,
# with sudo when not root), configures meson once and builds.
#
#   make demo    the main job: a local cluster training a real model
#   make test    every test suite (unit, integration, interop, fault, deploy),
#                then the unit suite again under valgrind
#   make bench   the benchmarks under bench/
#   make bench-tf-venv  tensorflow-cpu from PyPI in .venv-tf (about 1.6 GB),
#                for bench/train.py --tensorflow, case (d); not part of bench
#
# BUILD selects the build directory; MESON_ARGS passes options to meson.

BUILD ?= build
MESON_ARGS ?=
SHELL := /bin/bash

# Everything the build, the tests and the demo need, by Debian package name.
# kubectl (for `kubectl kustomize`, tests/deploy/test_k8s.py) comes from
# Debian's kubernetes-client unless a kubectl is installed already.
DEB_PACKAGES := \
	meson ninja-build pkg-config gcc g++ clang libclang-rt-14-dev \
	libgrpc-dev protobuf-c-compiler libprotobuf-c-dev liblmdb-dev \
	libuv1-dev libjansson-dev zlib1g-dev libopenblas-dev \
	check libsubunit-dev valgrind lmdb-utils \
	python3-grpcio python3-grpc-tools python3-numpy python3-yaml \
	dataset-fashion-mnist iproute2 procps \
	openssl libssl-dev \
	libmicrohttpd-dev libsystemd-dev libisal-dev python3-crc32c python3-protobuf prometheus \
	help2man man-db \
	python3-venv \
	libgloo-dev \
	python3-setuptools python3-pip python3-torch mypy \
	docker.io docker-compose debootstrap \
	$(if $(shell command -v kubectl),,kubernetes-client)

# The tests train a PyTorch model through psclient.torch (DEB_PACKAGES);
# the benchmarks compare against PyTorch too.
BENCH_PACKAGES := python3-torch redis-server libhiredis-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps bench-deps install-packages build test demo bench bench-tf-venv clean

all: build

deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(DEB_PACKAGES)"

bench-deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(BENCH_PACKAGES)"

install-packages:
	@missing=$$(for p in $(PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
		echo "make: installing Debian packages:" $$missing; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_ARGS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

test: build
	@rc=0; \
	meson test -C $(BUILD) --print-errorlogs --no-rebuild || rc=1; \
	/usr/bin/python3 tests/summary.py $(BUILD)/meson-logs/testlog.json "tests" > $(BUILD)/summary-main.txt || rc=1; \
	meson test -C $(BUILD) --setup valgrind --suite unit --print-errorlogs --no-rebuild || rc=1; \
	/usr/bin/python3 tests/summary.py $(BUILD)/meson-logs/testlog-valgrind.json "valgrind" > $(BUILD)/summary-valgrind.txt || rc=1; \
	if { [ -f $(BUILD)-fuzz/build.ninja ] || CC=clang meson setup $(BUILD)-fuzz -Dfuzz=enabled \
			-Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link -Dcuda=disabled; } && \
		ninja -C $(BUILD)-fuzz tests/fuzz/fuzz_decode tests/fuzz/fuzz_handlers tests/fuzz/fuzz_seeds; then \
		meson test -C $(BUILD)-fuzz --suite fuzz --no-rebuild --print-errorlogs || rc=1; \
		/usr/bin/python3 tests/summary.py $(BUILD)-fuzz/meson-logs/testlog.json "fuzz" > $(BUILD)/summary-fuzz.txt || rc=1; \
	else \
		rc=1; printf "  the clang fuzz build in $(BUILD)-fuzz failed\nfuzz: 0 passed, 1 failed, 0 skipped\n" > $(BUILD)/summary-fuzz.txt; \
	fi; \
	cat $(BUILD)/summary-main.txt $(BUILD)/summary-valgrind.txt $(BUILD)/summary-fuzz.txt | \
		/usr/bin/python3 tests/summary.py --total; \
	exit $$rc

demo: build
	bash deploy/demo.sh $(BUILD)

bench: build bench-deps
	bash bench/run.sh $(BUILD)

# TensorFlow's ParameterServerStrategy for bench/train.py --tensorflow.
TF_VENV ?= .venv-tf
TF_VERSION ?= 2.21.0

bench-tf-venv:
	@$(MAKE) --no-print-directory install-packages PACKAGES="python3-venv"
	@if $(TF_VENV)/bin/python -c 'import sys, tensorflow as tf; sys.exit(tf.__version__ != "$(TF_VERSION)")' 2>/dev/null; then \
		echo "make: $(TF_VENV) has tensorflow-cpu $(TF_VERSION)"; \
	else \
		/usr/bin/python3 -m venv $(TF_VENV) && \
		$(TF_VENV)/bin/pip install -q --disable-pip-version-check "tensorflow-cpu==$(TF_VERSION)" && \
		echo "make: $(TF_VENV) has tensorflow-cpu $(TF_VERSION)"; \
	fi

clean:
	rm -rf $(BUILD)
