# Thin wrapper: `make run` and `make test` each do all setup first (see README).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps configure build test run sanitize bench fuzz clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
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

run: build
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
