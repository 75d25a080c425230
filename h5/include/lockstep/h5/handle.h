// RAII for HDF5 C handles (hid_t): one owning wrapper, closed with the function that matches the
// handle's kind. Feature code never calls H5?close itself. Shared by the export writer
// (instrument/) and the export reader (compare/) through the lockstep::hdf5 target, so neither
// library depends on the other. Not thread-safe (HDF5 serial build): a handle lives on one thread
// (the writer thread; the reader's H5Dread path under its mutex).
#pragma once

#include <hdf5.h>

#include <utility>

namespace lockstep {

class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  ~H5Handle() { reset(); }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false when HDF5 reports a failure (e.g. a flush on close failed).
  bool reset() {
    if (id_ < 0) return true;
    herr_t r = 0;
    switch (H5Iget_type(id_)) {
      case H5I_FILE:
        r = H5Fclose(id_);
        break;
      case H5I_GROUP:
        r = H5Gclose(id_);
        break;
      case H5I_DATASET:
        r = H5Dclose(id_);
        break;
      case H5I_DATASPACE:
        r = H5Sclose(id_);
        break;
      case H5I_DATATYPE:
        r = H5Tclose(id_);
        break;
      case H5I_ATTR:
        r = H5Aclose(id_);
        break;
      case H5I_GENPROP_LST:
        r = H5Pclose(id_);
        break;
      default:
        r = H5Idec_ref(id_);
        break;
    }
    id_ = H5I_INVALID_HID;
    return r >= 0;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

}  // namespace lockstep
