# Install rules: libraries, public headers (under include/cofab/<folder>/), an exported CMake
# package (find_package(cofab) -> cofab::core, cofab::fabric, ...) and a pkg-config file.
include(CMakePackageConfigHelpers)

get_property(_cofab_targets GLOBAL PROPERTY COFAB_INSTALL_TARGETS)
install(TARGETS ${_cofab_targets} EXPORT cofabTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir core coding gpu fabric aggregator)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cofab/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()

set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/cofab)
install(EXPORT cofabTargets NAMESPACE cofab:: DESTINATION ${_cmakedir})
configure_package_config_file(cmake/cofabConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cofabConfig.cmake INSTALL_DESTINATION ${_cmakedir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cofabConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cofabConfig.cmake ${PROJECT_BINARY_DIR}/cofabConfigVersion.cmake
        DESTINATION ${_cmakedir})

file(RELATIVE_PATH COFAB_PC_RELATIVE_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file(cmake/cofab.pc.in ${PROJECT_BINARY_DIR}/cofab.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cofab.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
