# Small helpers in the manner of absl_cc_library: one library per folder,
# one test binary per folder, ctest labels unit / multiproc / netns / e2e /
# bench (README.md, "Tests").
#
#   tpu_dist_cc_library(NAME n SRCS ... HDRS ... DEPS ...)
#       -> target tpu_dist_<n>, alias tpu_dist::<n>, exported for find_package.
#   tpu_dist_cc_binary(NAME n SRCS ... DEPS ... [INSTALL])
#   tpu_dist_cc_test(NAME n SRCS ... DEPS ... [LABELS ...] [TIMEOUT s] [ARGS ...]
#                    [SUITE_LABELS "Suite=label[,label...];..."])
#       -> one GoogleTest binary, one ctest entry per test case
#          ("<n>.<Suite>.<Case>"; all instances of a value-parameterized
#          case are one entry "<n>.<Inst>/<Suite>.<Case>/*"), discovered when
#          ctest runs (like gtest_discover_tests' PRE_TEST: the build runs
#          nothing; cmake/tpu_dist_discover_tests.cmake). ARGS go to each case. LABELS (default unit) label every case whose
#          suite SUITE_LABELS does not name; a suite SUITE_LABELS names gets
#          its labels instead. The pseudo-label "serial" also sets RUN_SERIAL
#          (timing assertions that another test beside them would break).
#          TIMEOUT (default 600) bounds each case; cases labelled unit get at
#          most 120 s. README.md, "Tests", says what each label means.
#   tpu_dist_proto_library(NAME n PROTOS ... [GRPC])

# Libraries (exported, TpuDist::<n>) and the other targets `cmake --install`
# copies (INSTALL binaries, modules): cmake/tpu_dist_install.cmake builds the
# package config and the `installable` target from these two lists.
set_property(GLOBAL PROPERTY TPU_DIST_EXPORTED_TARGETS "")
set_property(GLOBAL PROPERTY TPU_DIST_INSTALLED_TARGETS "")

function(tpu_dist_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;HDRS;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target tpu_dist_${A_NAME})
  add_library(${target} ${A_SRCS} ${A_HDRS})
  add_library(tpu_dist::${A_NAME} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${A_NAME} OUTPUT_NAME tpu_dist_${A_NAME})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tpu_dist>)
  target_link_libraries(${target} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}")
  install(FILES ${A_HDRS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tpu_dist/${rel})
  set_property(GLOBAL APPEND PROPERTY TPU_DIST_EXPORTED_TARGETS ${target})
endfunction()

function(tpu_dist_cc_binary)
  cmake_parse_arguments(A "INSTALL" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
  target_compile_options(${A_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(A_INSTALL)
    install(TARGETS ${A_NAME} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    set_property(GLOBAL APPEND PROPERTY TPU_DIST_INSTALLED_TARGETS ${A_NAME})
  endif()
endfunction()

set(TPU_DIST_DISCOVER_TESTS_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/tpu_dist_discover_tests.cmake")

function(tpu_dist_cc_test)
  if(NOT TPU_DIST_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS;SUITE_LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_options(${A_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  foreach(entry ${A_SUITE_LABELS})
    if(NOT entry MATCHES "^[A-Za-z0-9_]+=[a-z0-9_]+(,[a-z0-9_]+)*$")
      message(FATAL_ERROR "tpu_dist_cc_test(${A_NAME}): SUITE_LABELS entry '${entry}' is not Suite=label[,label...]")
    endif()
  endforeach()
  # Discovery in the manner of gtest_discover_tests(... DISCOVERY_MODE
  # PRE_TEST): ctest includes this file, which lists the cases when the
  # binary is newer than the last list (cmake/tpu_dist_discover_tests.cmake).
  set(cases "${CMAKE_CURRENT_BINARY_DIR}/${A_NAME}_cases.cmake")
  set(env "TPU_DIST_BUILD_DIR=${PROJECT_BINARY_DIR};TPU_DIST_SOURCE_DIR=${PROJECT_SOURCE_DIR};OMP_NUM_THREADS=1")
  string(CONCAT content
    "set(_tdd_name [==[${A_NAME}]==])\n"
    "set(_tdd_exe [==[$<TARGET_FILE:${A_NAME}>]==])\n"
    "set(_tdd_out [==[${cases}]==])\n"
    "set(_tdd_args [==[${A_ARGS}]==])\n"
    "set(_tdd_default_labels [==[${A_LABELS}]==])\n"
    "set(_tdd_suite_labels [==[${A_SUITE_LABELS}]==])\n"
    "set(_tdd_timeout ${A_TIMEOUT})\n"
    "set(_tdd_env [==[${env}]==])\n"
    # Suites labelled `oracle` read the fixtures ctest regenerates on this
    # machine (tests/CMakeLists.txt: oracle_fixtures).
    "set(_tdd_oracle_dir [==[${PROJECT_BINARY_DIR}/oracle_fixtures]==])\n"
    "set(_tdd_workdir [==[${CMAKE_CURRENT_BINARY_DIR}]==])\n"
    "if(EXISTS \"\${_tdd_exe}\")\n"
    "  if(NOT EXISTS \"\${_tdd_out}\" OR NOT \"\${_tdd_out}\" IS_NEWER_THAN \"\${_tdd_exe}\" OR\n"
    "     NOT \"\${_tdd_out}\" IS_NEWER_THAN \"\${CMAKE_CURRENT_LIST_FILE}\" OR\n"
    "     NOT \"\${_tdd_out}\" IS_NEWER_THAN [==[${TPU_DIST_DISCOVER_TESTS_SCRIPT}]==])\n"
    "    include([==[${TPU_DIST_DISCOVER_TESTS_SCRIPT}]==])\n"
    "  endif()\n"
    "  include(\"\${_tdd_out}\")\n"
    "else()\n"
    "  add_test(${A_NAME}_NOT_BUILT ${A_NAME}_NOT_BUILT)\n"
    "endif()\n")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${A_NAME}_include.cmake")
  file(GENERATE OUTPUT "${include_file}" CONTENT "${content}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()

# Generates C++ for .proto files (and gRPC stubs with GRPC) into the build
# tree, rooted like the source tree so includes read
# "tpu_runtime/coordination/coordination.pb.h".
function(tpu_dist_proto_library)
  cmake_parse_arguments(A "GRPC" "NAME" "PROTOS" ${ARGN})
  set(srcs "")
  foreach(proto ${A_PROTOS})
    get_filename_component(abs "${proto}" ABSOLUTE)
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${abs}")
    string(REGEX REPLACE "\\.proto$" "" stem "${rel}")
    set(outs "${PROJECT_BINARY_DIR}/${stem}.pb.cc" "${PROJECT_BINARY_DIR}/${stem}.pb.h")
    set(args --cpp_out=${PROJECT_BINARY_DIR})
    if(A_GRPC)
      list(APPEND outs "${PROJECT_BINARY_DIR}/${stem}.grpc.pb.cc" "${PROJECT_BINARY_DIR}/${stem}.grpc.pb.h")
      list(APPEND args --grpc_out=${PROJECT_BINARY_DIR}
        --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>)
    endif()
    add_custom_command(OUTPUT ${outs}
      COMMAND protobuf::protoc ARGS -I${PROJECT_SOURCE_DIR} ${args} ${abs}
      DEPENDS ${abs} protobuf::protoc
      COMMENT "protoc ${rel}")
    list(APPEND srcs ${outs})
  endforeach()
  set(target tpu_dist_${A_NAME})
  add_library(${target} ${srcs})
  add_library(tpu_dist::${A_NAME} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${A_NAME} OUTPUT_NAME tpu_dist_${A_NAME})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tpu_dist>)
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf)
  if(A_GRPC)
    target_link_libraries(${target} PUBLIC gRPC::grpc++)
  endif()
  foreach(proto ${A_PROTOS})
    get_filename_component(abs "${proto}" ABSOLUTE)
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${abs}")
    string(REGEX REPLACE "\\.proto$" "" stem "${rel}")
    get_filename_component(dir "${rel}" DIRECTORY)
    install(FILES "${PROJECT_BINARY_DIR}/${stem}.pb.h" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tpu_dist/${dir})
    if(A_GRPC)
      install(FILES "${PROJECT_BINARY_DIR}/${stem}.grpc.pb.h" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tpu_dist/${dir})
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY TPU_DIST_EXPORTED_TARGETS ${target})
endfunction()
