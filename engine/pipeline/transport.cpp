#include "lockstep/engine/transport.h"

namespace lockstep {

InProcessTransport::InProcessTransport(int n_stages)
    : box_(static_cast<std::size_t>(n_stages > 1 ? n_stages - 1 : 0)), bytes_(box_.size(), 0) {}

Status InProcessTransport::Send(int from, Activation act) {
  if (from < 0 || static_cast<std::size_t>(from) >= box_.size())
    return Status::Runtime("transport",
                           "send from stage " + std::to_string(from) + " has no next stage");
  auto& slot = box_[static_cast<std::size_t>(from)];
  if (slot.has_value())
    return Status::Runtime("transport", "boundary " + std::to_string(from) + " is still full");
  bytes_[static_cast<std::size_t>(from)] +=
      act.device ? act.device->bytes() : act.hidden.size() * sizeof(float);
  slot = std::move(act);
  return Status::Ok();
}

Result<Activation> InProcessTransport::Recv(int to) {
  if (to < 1 || static_cast<std::size_t>(to) > box_.size())
    return Status::Runtime("transport",
                           "recv at stage " + std::to_string(to) + " has no previous stage");
  auto& slot = box_[static_cast<std::size_t>(to - 1)];
  if (!slot.has_value())
    return Status::Runtime("transport", "nothing was sent to stage " + std::to_string(to));
  Activation a = std::move(*slot);
  slot.reset();
  return a;
}

std::uint64_t InProcessTransport::bytes_sent(int from) const {
  return from >= 0 && static_cast<std::size_t>(from) < bytes_.size()
             ? bytes_[static_cast<std::size_t>(from)]
             : 0;
}

}  // namespace lockstep
