#include "lockstep/engine/step_record.h"

#include <nlohmann/json.hpp>

namespace lockstep {

std::string StepRecord::ToJsonLine() const {
  nlohmann::ordered_json j;
  j["schema"] = "lockstep.step";
  j["v"] = 1;
  j["step"] = step;
  j["begin_ns"] = begin_ns;
  j["end_ns"] = end_ns;
  j["rows"] = rows;
  j["seqs"] = seqs;
  j["verify_rows"] = verify_rows;
  j["prefill_rows"] = prefill_rows;
  j["queue_depth"] = queue_depth;
  j["live"] = live;
  j["weight_bytes"] = weight_bytes;
  j["flops"] = flops;
  j["slots"] = slots;
  nlohmann::ordered_json gs = nlohmann::ordered_json::array();
  for (const Group& g : groups)
    gs.push_back(
        {{"slot", g.slot}, {"mode", g.verify ? "verify" : "prefill"}, {"p", g.p}, {"T", g.T}});
  j["groups"] = gs;
  return j.dump();
}

}  // namespace lockstep
