# Third-party packages, all from Debian 12 (tools/install_deps.sh installs them).
# Why each one is here: README.md, "Dependencies".

find_package(Torch REQUIRED)            # tensors, autograd, nn, c10d (ProcessGroup, Store, Gloo)
find_package(absl REQUIRED)             # Status/StatusOr, strings, flags, Mutex, time
find_package(Protobuf REQUIRED)         # coordination service messages
find_package(gRPC CONFIG REQUIRED)      # coordination service transport
find_package(nlohmann_json REQUIRED)    # config.json, safetensors headers, tokenizer.json, metrics
find_package(Threads REQUIRED)
if(TPU_DIST_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(TPU_DIST_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

# One imported target for libtorch so consumers and our targets say `tpu_dist::torch`.
# Debian's libtorch ships Gloo inside libtorch_cpu; ProcessGroupGloo.hpp is
# guarded by USE_C10D_GLOO and needs libgloo-dev's headers.
if(NOT TARGET tpu_dist_torch)
  add_library(tpu_dist_torch INTERFACE)
  target_link_libraries(tpu_dist_torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(tpu_dist_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  target_compile_definitions(tpu_dist_torch INTERFACE USE_C10D_GLOO)
  add_library(tpu_dist::torch ALIAS tpu_dist_torch)
endif()
