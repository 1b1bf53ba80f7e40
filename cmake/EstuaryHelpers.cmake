# estuary_cc_library / estuary_cc_test: one library target per folder, tests beside the code.
# Our own targets get strict warnings; generated code and third-party code do not.

set(ESTUARY_WARNINGS -Wall -Wextra -Werror=unused-result -Werror=return-type -Wno-unused-parameter)

function(estuary_apply_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${ESTUARY_WARNINGS}>)
  if(ESTUARY_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${ESTUARY_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${ESTUARY_SANITIZE})
  endif()
  if(ESTUARY_FUZZ)
    # Coverage instrumentation for libFuzzer in the libraries under test; undefined behaviour
    # aborts (a finding), as address errors do, instead of printing and going on.
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link,address,undefined
                           -fno-sanitize-recover=all)
  endif()
endfunction()

# estuary_cc_library(NAME name SRCS ... DEPS ... [PUBLIC_DEFS ...])
# Creates `estuary_<name>` and the alias `estuary::<name>`. Include paths are from the repo root.
function(estuary_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS;PUBLIC_DEFS" ${ARGN})
  set(target estuary_${ARG_NAME})
  add_library(${target} STATIC ${ARG_SRCS})
  add_library(estuary::${ARG_NAME} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  if(ARG_PUBLIC_DEFS)
    target_compile_definitions(${target} PUBLIC ${ARG_PUBLIC_DEFS})
  endif()
  estuary_apply_flags(${target})
endfunction()

# estuary_cc_test(NAME name SRCS ... DEPS ... [LABELS ...])
# One GoogleTest binary, its cases discovered by ctest. Tests run from the source folder
# so that relative paths such as ../shared/models resolve as in CI.
function(estuary_cc_test)
  cmake_parse_arguments(ARG "" "NAME;RESOURCE_LOCK" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT ESTUARY_TESTS OR ESTUARY_FUZZ)
    return()
  endif()
  set(target ${ARG_NAME})
  add_executable(${target} ${ARG_SRCS})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${target} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_definitions(${target} PRIVATE
      ESTUARY_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
      ESTUARY_BINARY_DIR="${PROJECT_BINARY_DIR}")
  estuary_apply_flags(${target})
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  if("gpu" IN_LIST labels)
    # Collected into the `gpu_tests` target (top-level CMakeLists.txt), which CI's CUDA build
    # compiles.
    set_property(GLOBAL APPEND PROPERTY ESTUARY_GPU_TESTS ${target})
  endif()
  # RESOURCE_LOCK NAME: the test's cases never run beside another holder of NAME under
  # `ctest -j` (for tests that change something the whole machine shares).
  set(lock "")
  if(ARG_RESOURCE_LOCK)
    set(lock RESOURCE_LOCK ${ARG_RESOURCE_LOCK})
  endif()
  gtest_discover_tests(${target}
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS "${labels}" ${lock})
endfunction()
