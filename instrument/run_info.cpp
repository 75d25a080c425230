#include "lockstep/instrument/run_info.h"

#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

ExportRunInfo RequestRunInfo(const EngineConfig& config, std::span<const std::int32_t> prompt,
                             int max_new, const RequestResult& r) {
  ExportRunInfo m;
  m.config_json = config.ToJson();
  m.config_sha256 = Sha256Hex(m.config_json);
  m.request_sha256 = Sha256Tokens(prompt);
  m.seed = config.seed;
  m.max_new = max_new;
  m.request_tokens.assign(prompt.begin(), prompt.end());
  m.output_tokens = r.result.output;
  m.stop_reason = r.result.stop_reason;
  m.injections = r.injections;
  m.prefix_reuse = ReuseReasonText(r.prefix);
  m.prompt_tokens_reused =
      r.prefix.reason == ReuseReason::kKeptSlot ? r.prefix.kept_tokens : r.prefix.reused_tokens;
  if (!r.preemptions.empty()) m.preemptions = PreemptionsJson(r.preemptions);
  return m;
}

}  // namespace lockstep
