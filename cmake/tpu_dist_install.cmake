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
configure_package_config_file(cmake/TpuDistConfig.cmake.in
  "${PROJECT_BINARY_DIR}/TpuDistConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TpuDist)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/TpuDistConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/TpuDistConfig.cmake" cmake/tpu_dist_torch.cmake
  "${PROJECT_BINARY_DIR}/TpuDistConfigVersion.cmake"
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TpuDist)
