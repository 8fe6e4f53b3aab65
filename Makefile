# Thin wrapper: `make run` and `make test` each do all setup first (see README).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps configure build test run sanitize bench clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || (cat $(BUILD).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

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

clean:
	rm -rf $(BUILD) build-asan
