// A request's state export in `lockstep serve`: the same H5Exporter `lockstep generate --export`
// uses, one per request as its observer, written as `<export-dir>/<request id>.h5` (the client
// never names the path). A request that does not finish (cancelled, failed, the server killed)
// leaves only `<id>.h5.partial`.
#pragma once

#include <memory>
#include <string>

#include "lockstep/engine/engine_config.h"
#include "lockstep/engine/scheduler.h"
#include "lockstep/instrument/export_writer.h"
#include "serve/completion_request.h"

namespace lockstep {

struct ServeContext;
struct ServeJob;

// The exporter of a request (Create'd: `<dir>/<id>.h5.partial` exists), with the byte budget
// `max_mib` (0 = none) projected over the `max_windows` windows the request can run.
// kInvalidArgument for a bad windows / points text.
Result<std::unique_ptr<H5Exporter>> OpenRequestExport(const std::string& dir, const std::string& id,
                                                      const ExportRequest& e, int max_mib,
                                                      int max_windows);

// The export's file name (no folder: what the response names).
std::string ExportFileName(const std::string& id);

// Finishes `job`'s export with the request's run metadata (`config` is its effective config).
Status FinishRequestExport(const ServeContext& ctx, ServeJob& job, const RequestResult& r,
                           const EngineConfig& config);

}  // namespace lockstep
