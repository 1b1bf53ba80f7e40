# Every dependency is a Debian 12 package found with find_package (scripts/install_deps.sh).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# Messages only in the fuzz build (proto/CMakeLists.txt); gRPC stubs too in the others.
find_package(Protobuf REQUIRED)

if(NOT ESTUARY_FUZZ)
  find_package(hwy CONFIG REQUIRED)
  find_package(OpenBLAS CONFIG REQUIRED)
  if(NOT TARGET OpenBLAS::OpenBLAS)
    add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
    target_include_directories(OpenBLAS::OpenBLAS INTERFACE ${OpenBLAS_INCLUDE_DIRS})
    target_link_libraries(OpenBLAS::OpenBLAS INTERFACE ${OpenBLAS_LIBRARIES})
  endif()
  find_package(gRPC CONFIG REQUIRED)
  find_package(ucx CONFIG REQUIRED)
  find_package(GTest CONFIG REQUIRED)
  find_package(benchmark CONFIG REQUIRED)
  # Boost.Beast and Boost.Asio (header-only; libboost-dev) serve every HTTP port
  # (rpc/http_server.h).
  find_package(Boost 1.74 REQUIRED)
  # cpp-httplib, the HTTP client of bench-serve and of the tests. Debian builds it as a shared
  # library (libcpp-httplib.so, with OpenSSL/zlib/Brotli support): httplib.h declares only, and
  # the CPPHTTPLIB_*_SUPPORT definitions from its .pc must match the library's class layouts.
  find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
  # OpenSSL (libssl-dev) for certificate checks and the HTTPS door's certificate reload
  # (rpc/tls_files.h, rpc/certificate_reloader.h); gRPC, Asio and cpp-httplib use the same
  # library for TLS.
  find_package(OpenSSL REQUIRED)
endif()

if(ESTUARY_CUDA)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 does not know nvcc 13 takes C++20; .cu files stay C++17
  set(CMAKE_CUDA_ARCHITECTURES ${ESTUARY_CUDA_ARCHITECTURES})
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
endif()
