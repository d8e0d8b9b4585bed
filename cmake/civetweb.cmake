# CivetWeb for the agent's HTTP(S) endpoints (/healthz, /readyz, /gpus, the webhook's /mutate),
# built here from Debian's source package of the release the system package ships (1.15), with
# the OpenSSL 3 API linked at build time. Debian's libcivetweb (which prometheus-cpp uses for plain
# HTTP /metrics) loads OpenSSL 1.1 symbols by name at run time and calls a null function on the
# first TLS connection under OpenSSL 3, so it cannot serve HTTPS.
#
# The source comes through the package manager, not the build: tools/setup-deps.sh runs
# `apt-get source --download-only civetweb` (signed Sources index, hashes checked by apt) into
# .deps/civetweb/. Nothing is downloaded here; the tarball's hash is checked again.
set(ORION_CIVETWEB_SOURCE
    "${PROJECT_SOURCE_DIR}/.deps/civetweb/civetweb_1.15+dfsg.orig.tar.xz"
    CACHE FILEPATH "CivetWeb 1.15 source tarball (Debian's orig tarball, from tools/setup-deps.sh)")
set(_orion_civetweb_sha256 ec372e9737bc820118bbb735f46a07d41f795814ca0f38bc6e67048e7a460f33)
if(NOT EXISTS "${ORION_CIVETWEB_SOURCE}")
  message(FATAL_ERROR
    "CivetWeb source not found at ${ORION_CIVETWEB_SOURCE}: run `bash tools/setup-deps.sh` "
    "(it fetches Debian's civetweb source package with apt-get source), or set "
    "-DORION_CIVETWEB_SOURCE=PATH to civetweb_1.15+dfsg.orig.tar.xz")
endif()
file(SHA256 "${ORION_CIVETWEB_SOURCE}" _orion_civetweb_actual)
if(NOT _orion_civetweb_actual STREQUAL _orion_civetweb_sha256)
  message(FATAL_ERROR
    "${ORION_CIVETWEB_SOURCE}: SHA256 ${_orion_civetweb_actual}, expected "
    "${_orion_civetweb_sha256} (Debian's civetweb_1.15+dfsg.orig.tar.xz); delete it and run "
    "`bash tools/setup-deps.sh` again")
endif()
set(_orion_civetweb_dir "${CMAKE_BINARY_DIR}/_deps/civetweb")
if(NOT EXISTS "${_orion_civetweb_dir}/.extracted-${_orion_civetweb_sha256}")
  file(REMOVE_RECURSE "${_orion_civetweb_dir}")
  file(ARCHIVE_EXTRACT INPUT "${ORION_CIVETWEB_SOURCE}" DESTINATION "${_orion_civetweb_dir}")
  file(TOUCH "${_orion_civetweb_dir}/.extracted-${_orion_civetweb_sha256}")
endif()
file(GLOB _orion_civetweb_src LIST_DIRECTORIES true "${_orion_civetweb_dir}/civetweb*")
if(NOT _orion_civetweb_src OR NOT EXISTS "${_orion_civetweb_src}/src/civetweb.c")
  message(FATAL_ERROR "${ORION_CIVETWEB_SOURCE}: no civetweb*/src/civetweb.c inside")
endif()

find_package(OpenSSL REQUIRED)
find_package(Threads REQUIRED)
add_library(orion_civetweb STATIC ${_orion_civetweb_src}/src/civetweb.c)
target_include_directories(orion_civetweb SYSTEM BEFORE PUBLIC ${_orion_civetweb_src}/include)
# TLS through OpenSSL 3 linked now (no dlopen); no CGI, no Lua, no server-side scripting.
target_compile_definitions(orion_civetweb PRIVATE OPENSSL_API_3_0 NO_SSL_DL NO_CGI USE_IPV6)
target_compile_options(orion_civetweb PRIVATE -w)
set_target_properties(orion_civetweb PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(orion_civetweb PUBLIC OpenSSL::SSL OpenSSL::Crypto Threads::Threads
                      ${CMAKE_DL_LIBS})
