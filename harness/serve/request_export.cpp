#include "serve/request_export.h"

#include <chrono>
#include <ctime>

#include "lockstep/engine/tokenizer.h"
#include "lockstep/harness/host_fingerprint.h"
#include "lockstep/instrument/fingerprint.h"
#include "lockstep/instrument/run_info.h"
#include "serve/http_server.h"
#include "serve/serve_job.h"

namespace lockstep {

std::string ExportFileName(const std::string& id) { return id + ".h5"; }

Result<std::unique_ptr<H5Exporter>> OpenRequestExport(const std::string& dir, const std::string& id,
                                                      const ExportRequest& e, int max_mib,
                                                      int max_windows) {
  ExportOptions eo;
  eo.max_bytes = static_cast<std::uint64_t>(max_mib) << 20;
  eo.max_windows = max_windows;
  eo.path = dir + "/" + ExportFileName(id);
  LOCKSTEP_ASSIGN_OR_RETURN(eo.windows, WindowSelection::Parse(e.windows));
  LOCKSTEP_ASSIGN_OR_RETURN(eo.points, ParseExportPoints(e.points));
  return H5Exporter::Create(eo);
}

Status FinishRequestExport(const ServeContext& ctx, ServeJob& job, const RequestResult& r,
                           const EngineConfig& config) {
  ExportRunInfo meta = RequestRunInfo(config, job.prompt, config.max_new, r);
  meta.arm = job.req.arm;
  const auto now = std::chrono::system_clock::now();
  const std::time_t tt = std::chrono::system_clock::to_time_t(now);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
  meta.created_utc = ts;
  meta.run_id = Sha256Hex(job.id + "/" + ts).substr(0, 16);
  meta.executable_sha256 = ctx.executable_sha256;
  meta.model_sha256 = ctx.model_sha256;
  meta.host_json = ProbeHost(config.threads).ToJson().dump();
  meta.text_sha256 = Sha256Hex(ctx.tokenizer->Decode(r.result.output));  // as generate's
  meta.residency = job.residency;
  meta.counters = job.stage_counters;
  return job.exporter->Finish(meta);
}

}  // namespace lockstep
