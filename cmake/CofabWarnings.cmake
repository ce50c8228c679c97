# cofab_target_defaults(<target>): warnings (errors under COFAB_WERROR) and the generated
# include directory, applied to every target the project builds.
function(cofab_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${COFAB_WERROR}>>:-Werror>)
endfunction()

# cofab_hot_loops(<source> ...): files whose loops over whole tensors are a hot path (reduction
# kernels, codecs, model updates) build at -O3. GCC 12 vectorises at -O2 only with its
# "very-cheap" cost model, which leaves scalar every loop that needs a runtime alias check or an
# epilogue: most loops over caller-provided spans (bench/RESULTS.md, "Session 6": a model add
# 111 -> 21 us). Not in Debug builds, so those files still step through at -O0. Call it from the
# directory whose target compiles the files (source properties are per directory).
function(cofab_hot_loops)
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "$<$<NOT:$<CONFIG:Debug>>:-O3>")
endfunction()

# cofab_library(<name> <alias> SOURCES ... DEPS ...): one library per folder, exported as
# cofab::<alias>, includes written from the repository root.
function(cofab_library name alias)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT ARG_SOURCES)
    # A layer whose issue has not landed yet: the target and its links exist, code comes later.
    add_library(${name} INTERFACE)
    set_target_properties(${name} PROPERTIES EXPORT_NAME ${alias})
    target_link_libraries(${name} INTERFACE ${ARG_PUBLIC_DEPS})
  else()
    add_library(${name} ${ARG_SOURCES})
    set_target_properties(${name} PROPERTIES EXPORT_NAME ${alias} OUTPUT_NAME cofab_${alias}
                                             VERSION ${PROJECT_VERSION} SOVERSION 0)
    target_include_directories(${name} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
      $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/cofab>)
    target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
    cofab_target_defaults(${name})
    # A library's calls to its own functions bind inside it: no PLT hop per call, and GCC may
    # inline across them. cofab does not support interposing its symbols. The dpdk poller made
    # about ten PLT calls per frame; bound, its receiver gained 15-18% (bench/RESULTS.md,
    # "Session 8").
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition>)
    if(BUILD_SHARED_LIBS)
      target_link_options(${name} PRIVATE LINKER:-Bsymbolic-functions)
    endif()
  endif()
  add_library(cofab::${alias} ALIAS ${name})
  set_property(GLOBAL APPEND PROPERTY COFAB_INSTALL_TARGETS ${name})
endfunction()

# cofab_program(<name> SOURCES ... DEPS ...): an installed executable.
function(cofab_program name)
  cmake_parse_arguments(ARG "NO_INSTALL" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  cofab_target_defaults(${name})
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endfunction()
