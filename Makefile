# Thin wrapper: `make run` and `make test` each do all setup first (see README).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps deps-run configure configure-run build test run sanitize bench fuzz clean

# `make run` builds what the demo needs (the tessera command, 191 build steps here)
# with the CUDA backend only where a GPU is present; `make test` builds everything, the CUDA
# backend wherever nvcc is (it must compile on every machine, GPU or not), in the same folder:
# what `make run` built is reused, and only the tests, benchmarks and CUDA objects are added.
RUN_CUDA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo auto || echo off)

deps:
	@bash scripts/install-deps.sh

deps-run:
	@bash scripts/install-deps.sh run

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=auto \
	  -DTESSERA_TESTS=ON -DTESSERA_BENCH=ON $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || (cat $(BUILD).configure.log; exit 1)

configure-run: deps-run
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=$(RUN_CUDA) \
	  -DTESSERA_TESTS=OFF -DTESSERA_BENCH=OFF $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || (cat $(BUILD).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The unit tests, then each fuzz target for FUZZ_SECONDS over its seed corpus.
FUZZ_SECONDS ?= 20
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh build-fuzz

fuzz: deps
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh build-fuzz

run: configure-run
	@cmake --build $(BUILD) -j $(JOBS) --target tessera
	@bash scripts/demo.sh $(BUILD)/tessera

# Tests under AddressSanitizer and UndefinedBehaviorSanitizer (CUDA off: the sanitizers are for
# host code).
sanitize: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTESSERA_CUDA=off \
	  -DTESSERA_BENCH=OFF -DTESSERA_SANITIZE=address,undefined > build-asan.configure.log
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ctest --output-on-failure -j $(JOBS)

bench: build
	@$(BUILD)/tessera probe
	@$(BUILD)/tessera bench gemm
	@$(BUILD)/tessera bench train
	@$(BUILD)/tessera bench generate --threads 2 --prompt 512 --gen 128 --batch 1,4,16,64

clean:
	rm -rf $(BUILD) build-asan build-fuzz
