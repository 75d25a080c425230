// The run metadata of a request's export that follows from the request itself: its effective
// config (and digest), its prompt (and digest), seed, max_new, output, stop reason and
// injections. `lockstep serve`, preflight's probes and the serving tests export requests of a
// Scheduler and share this; each caller adds what only it knows (arm, run id, time, model and
// executable digests, residency, counters).
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/instrument/export_writer.h"

namespace lockstep {

ExportRunInfo RequestRunInfo(const EngineConfig& config, std::span<const std::int32_t> prompt,
                             int max_new, const RequestResult& r);

}  // namespace lockstep
