# CivetWeb for the agent's HTTP(S) endpoints (/healthz, /readyz, /gpus, the webhook's /mutate),
# built here from Debian's source of the release the system package ships (1.15), with the
# OpenSSL 3 API linked at build time. Debian's libcivetweb (which prometheus-cpp uses for plain
# HTTP /metrics) loads OpenSSL 1.1 symbols by name at run time and calls a null function on the
# first TLS connection under OpenSSL 3, so it cannot serve HTTPS.
#
# ORION_CIVETWEB_URL may name a local copy of the tarball for offline builds; the hash is checked
# either way.
include(FetchContent)
set(ORION_CIVETWEB_URL
    "http://deb.debian.org/debian/pool/main/c/civetweb/civetweb_1.15+dfsg.orig.tar.xz"
    CACHE STRING "CivetWeb 1.15 source tarball (Debian's orig tarball)")
FetchContent_Declare(orion_civetweb_src
  URL ${ORION_CIVETWEB_URL}
  URL_HASH SHA256=ec372e9737bc820118bbb735f46a07d41f795814ca0f38bc6e67048e7a460f33
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
FetchContent_GetProperties(orion_civetweb_src)
if(NOT orion_civetweb_src_POPULATED)
  FetchContent_Populate(orion_civetweb_src)
endif()

find_package(OpenSSL REQUIRED)
find_package(Threads REQUIRED)
add_library(orion_civetweb STATIC ${orion_civetweb_src_SOURCE_DIR}/src/civetweb.c)
target_include_directories(orion_civetweb SYSTEM BEFORE PUBLIC
                           ${orion_civetweb_src_SOURCE_DIR}/include)
# TLS through OpenSSL 3 linked now (no dlopen); no CGI, no Lua, no server-side scripting.
target_compile_definitions(orion_civetweb PRIVATE OPENSSL_API_3_0 NO_SSL_DL NO_CGI USE_IPV6)
target_compile_options(orion_civetweb PRIVATE -w)
set_target_properties(orion_civetweb PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(orion_civetweb PUBLIC OpenSSL::SSL OpenSSL::Crypto Threads::Threads
                      ${CMAKE_DL_LIBS})
