// civetweb, prometheus-cpp's HTTP server, starts its threads with a fixed stack of about 100 KB,
// and glibc carves the process's static TLS out of every thread's stack. With LibTorch's CUDA
// libraries loaded (cublasLt alone holds 92 KB of TLS) that leaves too little: pthread_create
// fails, and the exposer reports a port problem (SPEC §11). This definition, compiled into each
// executable that links praxis_server and exported from it, takes precedence over glibc's for
// every shared library: it raises a requested stack size to at least kMinStackBytes and then
// calls glibc's own.

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {
constexpr size_t kMinStackBytes = size_t{1} << 20;
}  // namespace

extern "C" __attribute__((visibility("default"))) int pthread_attr_setstacksize(
    pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn glibc = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return glibc(attr, std::max(size, kMinStackBytes));
}
