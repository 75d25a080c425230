#include "lockstep/engine/scheduler.h"

namespace lockstep {

RequestOptions RequestOptions::FromConfig(const EngineConfig& cfg) {
  RequestOptions o;
  o.max_new = cfg.max_new;
  o.sampling = SamplingFrom(cfg);
  o.ignore_eos = cfg.ignore_eos;
  o.spec = cfg.spec;
  o.mtp = cfg.mtp;
  o.spec_max_suffix = cfg.spec_max_suffix;
  o.suffix_index = cfg.suffix_index;
  o.draft_policy = cfg.draft_policy;
  o.replay_path = cfg.replay_path;
  o.inject = cfg.inject;
  return o;
}

const char* RequestEndName(RequestEnd e) {
  switch (e) {
    case RequestEnd::kFinished:
      return "finished";
    case RequestEnd::kCancelled:
      return "cancelled";
    case RequestEnd::kFailed:
      return "failed";
    case RequestEnd::kRefused:
      return "refused";
  }
  return "?";
}

}  // namespace lockstep
