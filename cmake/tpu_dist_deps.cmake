# Third-party packages: Debian 12 packages and, for libtorch, the project
# venv's torch wheel (tools/install_deps.sh installs both).
# Why each one is here: README.md, "Dependencies".

# tensors, autograd, nn, c10d (Backend, Store, Gloo): the venv's torch wheel.
include(cmake/tpu_dist_torch.cmake)
set(TPU_DIST_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
  "Python interpreter whose torch wheel provides libtorch")
tpu_dist_find_torch(tpu_dist_torch_wheel)
# What our targets link: the wheel target in the build tree, the one the
# installed TpuDistConfig.cmake defines (same wheel) in an installed tree.
add_library(tpu_dist_torch INTERFACE)
target_link_libraries(tpu_dist_torch INTERFACE
  $<BUILD_INTERFACE:tpu_dist_torch_wheel> $<INSTALL_INTERFACE:TpuDist::torch_wheel>)
add_library(tpu_dist::torch ALIAS tpu_dist_torch)
# Binaries find libtorch at run time from the build and the install tree.
list(APPEND CMAKE_INSTALL_RPATH "${TPU_DIST_TORCH_LIB_DIR}")
find_package(absl REQUIRED)             # Status/StatusOr, strings, flags, Mutex, time
find_package(Protobuf REQUIRED)         # coordination service messages
find_package(gRPC CONFIG REQUIRED)      # coordination service transport
find_package(nlohmann_json REQUIRED)    # config.json, safetensors headers, tokenizer.json, metrics
find_package(OpenSSL REQUIRED)         # HMAC and random bytes of the job's authentication; gRPC TLS
find_package(Threads REQUIRED)
if(TPU_DIST_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(TPU_DIST_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
