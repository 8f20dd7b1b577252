# libtorch from the project venv's `torch` wheel (tools/install_deps.sh).
#
# PyPI's Linux torch wheel is the CUDA build, and its TorchConfig.cmake asks
# for CUDA (find_package(CUDA) via Caffe2Config). We build for CPU only, so we
# do what torch.utils.cpp_extension does for a CPU extension: take the wheel's
# include directories and link only its CPU libraries, libtorch_cpu and libc10
# (libtorch_cpu's own RPATH finds the CUDA runtime wheels it needs at load).
#
# tpu_dist_find_torch(<target> [IMPORTED]) defines the INTERFACE target
# <target> (the wheel's headers, libtorch_cpu + libc10, C++20, USE_C10D_GLOO)
# and sets, in the caller's scope,
#   TPU_DIST_TORCH_DIR      site-packages/torch of ${TPU_DIST_PYTHON}
#   TPU_DIST_TORCH_LIB_DIR  its lib/
# TPU_DIST_PYTHON (cache) is the interpreter whose torch is used. The project
# build calls it for tpu_dist_torch_wheel; the installed TpuDistConfig.cmake
# calls the installed copy of this file for TpuDist::torch_wheel, with the
# interpreter recorded at install time. Fails at configure time, in one line,
# when the venv or torch is missing or the wrong version, or the wheel's C++
# ABI differs from Debian's libraries.

set(TPU_DIST_TORCH_VERSION "2.15.0")

function(tpu_dist_find_torch target)
  if(NOT EXISTS "${TPU_DIST_PYTHON}")
    message(FATAL_ERROR "tpu_dist: no project virtualenv (${TPU_DIST_PYTHON} is missing): run tools/install_deps.sh")
  endif()
  execute_process(
    COMMAND "${TPU_DIST_PYTHON}" -c
      "import os, torch; print(torch.__version__.split('+')[0]); print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _torch_out ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _torch_rc EQUAL 0)
    string(REGEX REPLACE "\n" " | " _torch_err "${_torch_err}")
    message(FATAL_ERROR "tpu_dist: `import torch` fails in ${TPU_DIST_PYTHON}: run tools/install_deps.sh (${_torch_err})")
  endif()
  string(REPLACE "\n" ";" _torch_out "${_torch_out}")
  list(GET _torch_out 0 _torch_version)
  list(GET _torch_out 1 TPU_DIST_TORCH_DIR)
  list(GET _torch_out 2 _torch_abi)
  if(NOT _torch_version VERSION_EQUAL TPU_DIST_TORCH_VERSION)
    message(FATAL_ERROR "tpu_dist: the venv has torch ${_torch_version}, this tree needs ${TPU_DIST_TORCH_VERSION}: run tools/install_deps.sh")
  endif()
  # Debian's Abseil, protobuf and gRPC use the C++11 std::string ABI; a torch
  # built with the old ABI would link but pass strings across with a different
  # layout. Catch it here rather than at link (or run) time.
  if(NOT _torch_abi EQUAL 1)
    message(FATAL_ERROR "tpu_dist: torch ${_torch_version} in ${TPU_DIST_PYTHON} was built with _GLIBCXX_USE_CXX11_ABI=0, Debian's libraries with 1: use a torch wheel built with the C++11 ABI (torch >= 2.7 on PyPI)")
  endif()

  set(TPU_DIST_TORCH_LIB_DIR "${TPU_DIST_TORCH_DIR}/lib")
  foreach(_lib torch_cpu c10)
    if(NOT EXISTS "${TPU_DIST_TORCH_LIB_DIR}/lib${_lib}.so")
      message(FATAL_ERROR "tpu_dist: ${TPU_DIST_TORCH_LIB_DIR}/lib${_lib}.so is missing: run tools/install_deps.sh")
    endif()
  endforeach()
  message(STATUS "tpu_dist: libtorch ${_torch_version} from ${TPU_DIST_TORCH_DIR}")

  # libtorch_cpu records the CUDA runtime wheels it needs as $ORIGIN-relative
  # RPATH entries; the linker resolves those itself, this only makes sure.
  file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${TPU_DIST_TORCH_DIR}/../nvidia/*/lib")

  if(ARGV1 STREQUAL "IMPORTED")
    add_library(${target} INTERFACE IMPORTED)
  else()
    add_library(${target} INTERFACE)
  endif()
  target_link_libraries(${target} INTERFACE
    "${TPU_DIST_TORCH_LIB_DIR}/libtorch_cpu.so" "${TPU_DIST_TORCH_LIB_DIR}/libc10.so")
  foreach(_dir ${_nvidia_lib_dirs})
    target_link_options(${target} INTERFACE "LINKER:-rpath-link,${_dir}")
  endforeach()
  target_include_directories(${target} SYSTEM INTERFACE
    "${TPU_DIST_TORCH_DIR}/include" "${TPU_DIST_TORCH_DIR}/include/torch/csrc/api/include")
  # libtorch 2.15's headers need C++20 (our own code is C++17); USE_C10D_GLOO
  # exposes ProcessGroupGloo.hpp (Gloo's headers: libgloo-dev, see README).
  target_compile_features(${target} INTERFACE cxx_std_20)
  target_compile_definitions(${target} INTERFACE USE_C10D_GLOO _GLIBCXX_USE_CXX11_ABI=1)
  set(TPU_DIST_TORCH_DIR "${TPU_DIST_TORCH_DIR}" PARENT_SCOPE)
  set(TPU_DIST_TORCH_LIB_DIR "${TPU_DIST_TORCH_LIB_DIR}" PARENT_SCOPE)
endfunction()
