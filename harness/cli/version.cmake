# Writes OUT (version_info.cpp) from IN with the source tree's commit. Run at every build
# (harness/CMakeLists.txt); configure_file rewrites OUT only when its text changes, so an
# unchanged commit compiles nothing and a new one compiles this one file.
# Inputs: IN, OUT, SOURCE_DIR, LOCKSTEP_VERSION, LOCKSTEP_BUILD_TYPE, LOCKSTEP_CUDA_BUILT.
set(LOCKSTEP_COMMIT "unknown")
find_program(GIT_EXECUTABLE git)
if(GIT_EXECUTABLE)
  # Only the source tree's own repository: not one that merely contains it.
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --show-toplevel
    OUTPUT_VARIABLE _top RESULT_VARIABLE _top_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
if(GIT_EXECUTABLE AND _top_rc EQUAL 0 AND _top STREQUAL SOURCE_DIR)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} describe --always --dirty --abbrev=12
    OUTPUT_VARIABLE _commit RESULT_VARIABLE _rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_rc EQUAL 0 AND NOT _commit STREQUAL "")
    set(LOCKSTEP_COMMIT "${_commit}")
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
