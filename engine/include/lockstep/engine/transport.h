// Transport: how activations travel from one pipeline stage to the next.
//
// One interface, several transports: in-process hand-off (CPU, here), CUDA stream/event copies
// and NCCL send/recv (CUDA backend). A hand-off moves the buffer; nothing is copied in process.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

// Device-resident activations of a device backend; opaque to the engine core (the CUDA backend's
// holds a device buffer and the event that marks it ready).
struct DeviceActivation {
  virtual ~DeviceActivation() = default;
  virtual std::size_t bytes() const = 0;  // bytes a hand-off moves
};

// Activations of T rows at positions p..p+T-1 between stages.
struct Activation {
  int p = 0;
  int T = 0;
  std::vector<float> hidden;  // f32 [T, H] residual stream (host backends)
  std::shared_ptr<DeviceActivation>
      device;  // the same rows on a device (device backends), else null
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Hands `act` from stage `from` to stage `from + 1`.
  virtual Status Send(int from, Activation act) = 0;
  // Takes what stage `to - 1` sent to stage `to`. kRuntime when nothing was sent.
  virtual Result<Activation> Recv(int to) = 0;
  // Bytes handed over at boundary `from` -> `from + 1` since creation.
  virtual std::uint64_t bytes_sent(int from) const = 0;
};
using TransportPtr = std::unique_ptr<Transport>;

// Single-threaded in-process mailboxes, one per boundary.
class InProcessTransport final : public Transport {
 public:
  explicit InProcessTransport(int n_stages);
  Status Send(int from, Activation act) override;
  Result<Activation> Recv(int to) override;
  std::uint64_t bytes_sent(int from) const override;

 private:
  std::vector<std::optional<Activation>> box_;  // [n_stages - 1]
  std::vector<std::uint64_t> bytes_;
};

}  // namespace lockstep
