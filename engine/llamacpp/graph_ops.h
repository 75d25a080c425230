// GraphOps: llama.cpp's graph evaluation callback (cb_eval) turned into lockstep op records
// (op_table.h), for the request's rows of each llama_decode (llama_engine.h says which tensors
// and rows). One per context; the driver sets the call's rows (BeginCall) before each decode.
//
// Threading: llama.cpp calls Eval from the thread that runs llama_decode (the driver's); ggml's
// worker threads never call it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "llama_lib.h"
#include "lockstep/engine/op_table.h"

namespace lockstep {

class GraphOps {
 public:
  explicit GraphOps(const LlamaLib& lib) : lib_(lib) {}
  GraphOps(const GraphOps&) = delete;
  GraphOps& operator=(const GraphOps&) = delete;

  // The next llama_decode: its window, the position of each batch row that belongs to the
  // request (-1 for other sequences' rows), and how many sequences it holds. `sink` null: no ops
  // are asked for during that call.
  void BeginCall(int window, std::vector<int> row_pos, int n_seqs,
                 const std::function<void(const OpRecord&)>* sink);
  void EndCall() { sink_ = nullptr; }

  // The cb_eval entry (user_data = this).
  static bool Callback(ggml_tensor* t, bool ask, void* user_data);

 private:
  bool Wants(const ggml_tensor* t) const;
  void Report(const ggml_tensor* t);
  const OpDef* DefFor(const ggml_tensor* t);
  int TokenDim(const ggml_tensor* t) const;

  const LlamaLib& lib_;
  int window_ = -1, n_seqs_ = 1;
  std::vector<int> row_pos_;  // per batch row: the request's position, -1 another sequence's
  const std::function<void(const OpRecord&)>* sink_ = nullptr;
  // OpDefs by tensor name (first sighting fixes the inputs); deques keep the pointers stable.
  struct DefStore {
    std::string name, inputs;
    OpDef def;
  };
  std::deque<DefStore> defs_;
  std::map<std::string, const OpDef*, std::less<>> by_name_;
  std::vector<std::byte> bytes_, row_bytes_;
  std::vector<float> row_floats_;
};

}  // namespace lockstep
