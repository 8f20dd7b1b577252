# `cmake --install` produces a package a C++ trainer consumes with
#   find_package(TpuDist REQUIRED)
#   target_link_libraries(my_trainer PRIVATE TpuDist::fsdp)
# tests/install_consumer builds such a trainer against an installed tree.
include(CMakePackageConfigHelpers)

get_property(exported GLOBAL PROPERTY TPU_DIST_EXPORTED_TARGETS)
set_target_properties(tpu_dist_torch PROPERTIES EXPORT_NAME torch)
install(TARGETS tpu_dist_torch ${exported}
  EXPORT TpuDistTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT TpuDistTargets
  NAMESPACE TpuDist::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TpuDist)
# `cmake --install` copies files, it builds nothing: `installable` builds
# everything it copies (tools/build.sh installable; tools/demo.sh builds it).
get_property(installed GLOBAL PROPERTY TPU_DIST_INSTALLED_TARGETS)
add_custom_target(installable)
if(exported OR installed)
  add_dependencies(installable ${exported} ${installed})
endif()
set(_built_files "")
foreach(t ${exported} ${installed})
  list(APPEND _built_files "$<TARGET_FILE:${t}>")
endforeach()
string(CONCAT _install_check "set(_tpu_dist_built \"${_built_files}\")\n" [=[
set(_missing "")
foreach(_f IN LISTS _tpu_dist_built)
  if(NOT EXISTS "${_f}")
    string(APPEND _missing "\n  ${_f}")
  endif()
endforeach()
if(_missing)
  message(FATAL_ERROR "tpu_dist: cmake --install copies files that are not built:${_missing}\n"
    "Build them first: tools/build.sh installable")
endif()
]=])
file(GENERATE OUTPUT "${PROJECT_BINARY_DIR}/tpu_dist_install_check.cmake" CONTENT "${_install_check}")

# TpuDistConfig.cmake.in's @TPU_DIST_CONFIG_TARGETS@: every exported target, one a line.
set(TPU_DIST_CONFIG_TARGETS "")
foreach(t tpu_dist_torch ${exported})
  get_target_property(name ${t} EXPORT_NAME)
  string(APPEND TPU_DIST_CONFIG_TARGETS "\n#   TpuDist::${name}")
endforeach()
configure_package_config_file(cmake/TpuDistConfig.cmake.in
  "${PROJECT_BINARY_DIR}/TpuDistConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TpuDist)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/TpuDistConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/TpuDistConfig.cmake" cmake/tpu_dist_torch.cmake
  "${PROJECT_BINARY_DIR}/TpuDistConfigVersion.cmake"
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TpuDist)
