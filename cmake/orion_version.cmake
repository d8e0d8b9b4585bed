# Writes orion_version.h (VERSION and the current git commit) at build time, only when its text
# changes, so that --version names the commit the binaries were built from, not the one the
# build folder was configured at. Run by the orion_version_header target:
#   cmake -DSOURCE_DIR=... -DOUTPUT=... -P orion_version.cmake
file(STRINGS "${SOURCE_DIR}/VERSION" ORION_VERSION LIMIT_COUNT 1)
execute_process(COMMAND git rev-parse --short=12 HEAD
                WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE ORION_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE result)
if(NOT result EQUAL 0 OR ORION_GIT_COMMIT STREQUAL "")
  set(ORION_GIT_COMMIT "unknown")
endif()
configure_file(${SOURCE_DIR}/version.h.in ${OUTPUT} @ONLY)
