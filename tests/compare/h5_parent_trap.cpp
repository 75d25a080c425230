// Test-only LD_PRELOAD shim (never linked into lockstep): interposes the libhdf5 entry points the
// export reader uses and abort()s when one is called from the process that loaded the shim, so
// `LD_PRELOAD=libh5_parent_trap.so lockstep diff A B` dies unless every HDF5 call happens in a
// forked child (the isolated reader's). Calls from any other pid go on to the real libhdf5
// (dlsym RTLD_NEXT). tests/compare/isolate_test.cpp runs the commands under it, and the same
// commands with --no-isolate, which must abort (the proof that the shim catches calls).
#include <dlfcn.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace {

pid_t g_loader = 0;

__attribute__((constructor)) void RememberLoader() { g_loader = ::getpid(); }

void Trap(const char* fn) {
  if (::getpid() != g_loader) return;
  const char pre[] = "h5_parent_trap: the parent process called ";
  [[maybe_unused]] ssize_t w = ::write(2, pre, sizeof(pre) - 1);
  w = ::write(2, fn, std::strlen(fn));
  w = ::write(2, "\n", 1);
  std::abort();
}

template <class F>
F Real(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

#define LOCKSTEP_TRAP(RET, NAME, PARAMS, ARGS)     \
  extern "C" RET NAME PARAMS {                     \
    Trap(#NAME);                                   \
    static auto real = Real<RET(*) PARAMS>(#NAME); \
    return real ARGS;                              \
  }

LOCKSTEP_TRAP(herr_t, H5open, (void), ())
LOCKSTEP_TRAP(hid_t, H5Fopen, (const char* name, unsigned flags, hid_t fapl), (name, flags, fapl))
LOCKSTEP_TRAP(hid_t, H5Pcreate, (hid_t cls), (cls))
LOCKSTEP_TRAP(herr_t, H5Eset_auto2, (hid_t es, H5E_auto2_t func, void* data), (es, func, data))
LOCKSTEP_TRAP(hid_t, H5Oopen, (hid_t loc, const char* name, hid_t lapl), (loc, name, lapl))
LOCKSTEP_TRAP(hid_t, H5Gopen2, (hid_t loc, const char* name, hid_t gapl), (loc, name, gapl))
LOCKSTEP_TRAP(hid_t, H5Dopen2, (hid_t loc, const char* name, hid_t dapl), (loc, name, dapl))
LOCKSTEP_TRAP(herr_t, H5Dread, (hid_t ds, hid_t mt, hid_t ms, hid_t fs, hid_t xfer, void* buf),
              (ds, mt, ms, fs, xfer, buf))
LOCKSTEP_TRAP(htri_t, H5Lexists, (hid_t loc, const char* name, hid_t lapl), (loc, name, lapl))
LOCKSTEP_TRAP(htri_t, H5Aexists, (hid_t obj, const char* name), (obj, name))
LOCKSTEP_TRAP(hid_t, H5Aopen, (hid_t obj, const char* name, hid_t aapl), (obj, name, aapl))
LOCKSTEP_TRAP(herr_t, H5Aread, (hid_t attr, hid_t type, void* buf), (attr, type, buf))
LOCKSTEP_TRAP(H5I_type_t, H5Iget_type, (hid_t id), (id))
LOCKSTEP_TRAP(hid_t, H5Dget_type, (hid_t ds), (ds))
LOCKSTEP_TRAP(hid_t, H5Dget_space, (hid_t ds), (ds))
LOCKSTEP_TRAP(herr_t, H5Fclose, (hid_t f), (f))
