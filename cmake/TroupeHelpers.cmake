# troupe_add_test(NAME name SOURCES a.cc ... LIBS lib ... LABEL unit|ranks|multiproc
#                 [TIMEOUT seconds])
# Builds one GoogleTest binary and registers it with ctest, with a timeout and
# a label (STYLE.md, Tests).
function(troupe_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LABEL)
    message(FATAL_ERROR "troupe_add_test(${T_NAME}): LABEL is required")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE troupe_options troupe_test_common ${T_LIBS}
                        GTest::gtest GTest::gtest_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --gtest_color=no)
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS ${T_LABEL})
endfunction()

# troupe_add_bench(NAME name SOURCES a.cc ... LIBS lib ...)
# Builds one Google Benchmark binary with the shared bench helpers.
function(troupe_add_bench)
  cmake_parse_arguments(B "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${B_NAME} ${B_SOURCES})
  target_link_libraries(${B_NAME} PRIVATE troupe_options troupe_bench_common ${B_LIBS}
                        benchmark::benchmark)
endfunction()
