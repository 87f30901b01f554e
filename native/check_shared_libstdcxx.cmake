# Post-link check of gnncompile._C: the module must load the C++ runtime (libstdc++) as a shared
# library, the one torch uses. A module that carries its own static copy crashes (SIGSEGV in
# std::ostream) the first time an error message formats a number: seen with a toolchain whose
# g++ only had libstdc++.a. Run by CMakeLists.txt as
#   cmake -DMODULE=<file> -DREADELF=<readelf> -DCOMPILER=<c++> -P check_shared_libstdcxx.cmake
if(NOT READELF)
  message(STATUS "gnncompile: no readelf; the libstdc++ link check is skipped")
  return()
endif()
execute_process(COMMAND "${READELF}" -d "${MODULE}" OUTPUT_VARIABLE _dyn RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(STATUS "gnncompile: readelf failed on ${MODULE}; the libstdc++ link check is skipped")
  return()
endif()
if(NOT _dyn MATCHES "NEEDED[^\n]*libstdc\\+\\+\\.so")
  file(REMOVE "${MODULE}")
  message(FATAL_ERROR
    "gnncompile: ${MODULE} links the C++ runtime statically (no libstdc++.so among its NEEDED "
    "libraries), so it would crash when it raises an error. The compiler ${COMPILER} links "
    "libstdc++ statically (it has no libstdc++.so, or its flags say -static-libstdc++). Build "
    "with a compiler that links it dynamically, for example: CXX=/usr/bin/g++ "
    "CUDAHOSTCXX=/usr/bin/g++ pip install --no-build-isolation -e .")
endif()
