// The slot actions: the HTTP side (parse, validate, answer) and the EngineDriver members that run
// them on the driver thread, which owns the Engine and the Scheduler.
#include "serve/slot_actions.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/slot_file.h"
#include "serve/completion_response.h"
#include "serve/completions_handler.h"
#include "serve/engine_driver.h"
#include "serve/http_server.h"
#include "serve/json_body.h"

namespace lockstep {

namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

ApiError Conflict(std::string message, std::string code) {
  ApiError e = ApiError::BadRequest(std::move(message), "", std::move(code));
  e.status = 409;
  return e;
}

// A slot-file error as the client's answer: the file's own faults are 400 (naming the part),
// a missing file 404, anything else (reading, writing) 500. `path` never reaches the client.
// A slot file is read on the HTTP thread, never the engine's (a FIFO there wedged the engine
// while /health said 200). The name's last component is opened with O_NOFOLLOW (a symbolic link
// is refused, pointing in or out of the folder) and O_NONBLOCK (a FIFO cannot block the open),
// then fstat'ed: only a regular file of at most `max` bytes is read. The name itself cannot
// leave the folder (ParseFileBody: no '/', no leading '.').
Result<std::string> ReadSlotFile(const std::string& path, const std::string& name,
                                 std::uint64_t max) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound("slot file '" + name + "'", "does not exist");
    if (e == ELOOP)
      return Status::InvalidArgument("slot file '" + name + "'", "is a symbolic link (refused)");
    return Status::InvalidArgument("slot file '" + name + "'", std::strerror(e));
  }
  struct Fd {
    int fd;
    ~Fd() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return Status::InvalidArgument("slot file '" + name + "'",
                                   "is not a regular file (a folder, FIFO, socket or device)");
  if (static_cast<std::uint64_t>(st.st_size) > max)
    return Status::InvalidArgument("slot file '" + name + "'", "is larger than the slot limit");
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::IOError("slot file '" + name + "'", "read failed or cut short");
    got += static_cast<std::size_t>(r);
  }
  return bytes;
}

// Saving over a name that is there and not a regular file (a folder, FIFO, symbolic link) is
// refused rather than replaced.
Status CheckSaveTarget(const std::string& path, const std::string& name) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();
  if (S_ISREG(st.st_mode)) return Status::Ok();
  return Status::InvalidArgument("slot file '" + name + "'",
                                 "exists and is not a regular file (refused)");
}

ApiError FileError(const Status& s, const std::string& path, const std::string& name) {
  std::string m = s.message();
  for (std::size_t at; (at = m.find(path)) != std::string::npos;) m.replace(at, path.size(), name);
  switch (s.code()) {
    case Status::Code::kCorruption:
    case Status::Code::kInvalidArgument:
      return ApiError::BadRequest(m, "filename", "invalid_slot_file");
    case Status::Code::kNotFound:
      return ApiError::NotFound(m, "slot_file_not_found");
    default:
      return ApiError::Internal(m);
  }
}

// {"filename": NAME} with nothing else.
std::variant<std::string, ApiError> ParseFileBody(const std::string& body) {
  auto parsed = ParseJsonObjectBody<nlohmann::json>(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    e->message += " (the body is {\"filename\": NAME})";
    return *e;
  }
  const nlohmann::json& j = std::get<nlohmann::json>(parsed);
  for (const auto& [key, v] : j.items())
    if (key != "filename")
      return ApiError::BadRequest("unknown field '" + key + "'", key, "unknown_field");
  if (!j.contains("filename") || !j["filename"].is_string())
    return ApiError::BadRequest("'filename' must be a string", "filename", "invalid_type");
  const std::string name = j["filename"].get<std::string>();
  if (!PlainFileName(name))
    return ApiError::BadRequest(
        "'filename' must be 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'",
        "filename", "invalid_value");
  return name;
}

}  // namespace

bool PlainFileName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

void HandleSlotAction(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  if (!ctx.ready) return SendError(res, ApiError::Unavailable("loading the model", "loading"));
  const std::string action = req.get_param_value("action");
  if (action != "save" && action != "restore" && action != "erase" && action != "preempt")
    return SendError(res, ApiError::BadRequest("'action' must be save, restore, erase or preempt",
                                               "action", "invalid_value"));
  const std::string digits = req.matches.size() > 1 ? std::string(req.matches[1]) : "";
  const int n_slots = ctx.engine_config.slots;
  const int slot = digits.size() <= 6 ? std::atoi(digits.c_str()) : -1;
  if (slot < 0 || slot >= n_slots)
    return SendError(res, ApiError::BadRequest("no slot " + digits.substr(0, 16) + " (0.." +
                                                   std::to_string(n_slots - 1) + ")",
                                               "id_slot", "invalid_slot"));
  EngineDriver::SlotAnswer answer;
  if (action == "erase") {
    answer = ctx.driver->EraseSlot(slot);
  } else if (action == "preempt") {
    answer = ctx.driver->PreemptSlot(slot);
  } else {
    if (ctx.opts.slot_dir.empty()) {
      ApiError e =
          ApiError::NotImplemented("slot " + action + " needs a server started with --slot-dir");
      return SendError(res, e);
    }
    auto name = ParseFileBody(req.body);
    if (auto* e = std::get_if<ApiError>(&name)) return SendError(res, *e);
    const std::string& n = std::get<std::string>(name);
    const std::string path = ctx.opts.slot_dir + "/" + n;
    if (action == "save") {
      if (Status s = CheckSaveTarget(path, n); !s.ok())
        return SendError(res, FileError(s, path, n));
      answer = ctx.driver->SaveSlot(slot, path, n);
    } else {
      Result<std::string> bytes = ReadSlotFile(path, n, kSlotFileMaxBytes);
      if (!bytes.ok()) return SendError(res, FileError(bytes.status(), path, n));
      answer = ctx.driver->RestoreSlot(slot, std::move(*bytes), n);
    }
  }
  if (auto* e = std::get_if<ApiError>(&answer)) return SendError(res, *e);
  res.set_content(Dump(std::get<nlohmann::json>(answer)), "application/json");
}

// ---- on the driver thread ----

bool EngineDriver::Call(std::function<void()> fn) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto d = std::make_shared<Done>();
  {
    std::lock_guard lk(mu_);
    if (stop_) return false;
    commands_.push_back({Command::kCall, nullptr, [this, d, fn = std::move(fn)] {
                           fn();
                           Publish();  // /slots shows the change before the answer goes out
                           std::lock_guard dl(d->mu);
                           d->done = true;
                           d->cv.notify_all();
                         }});
    cv_.notify_one();
  }
  std::unique_lock dl(d->mu);
  d->cv.wait(dl, [&] { return d->done; });
  return true;
}

namespace {
ApiError Stopped() { return ApiError::Unavailable("the server is shutting down", "draining"); }
}  // namespace

EngineDriver::SlotAnswer EngineDriver::SaveSlot(int slot, const std::string& path,
                                                const std::string& name) {
  SlotAnswer a = Stopped();
  Call([&] { a = SaveSlotNow(slot, path, name); });
  return a;
}

EngineDriver::SlotAnswer EngineDriver::RestoreSlot(int slot, std::string bytes,
                                                   const std::string& name) {
  SlotAnswer a = Stopped();
  Call([&] { a = RestoreSlotNow(slot, bytes, name); });
  return a;
}

EngineDriver::SlotAnswer EngineDriver::EraseSlot(int slot) {
  SlotAnswer a = Stopped();
  Call([&] { a = EraseSlotNow(slot); });
  return a;
}

EngineDriver::SlotAnswer EngineDriver::PreemptSlot(int slot) {
  SlotAnswer a = Stopped();
  Call([&] { a = PreemptSlotNow(slot); });
  return a;
}

EngineDriver::SlotAnswer EngineDriver::PreemptSlotNow(int slot) {
  const Ticket t = scheduler_.RunningIn(slot);
  const auto job = jobs_.find(t);
  if (t == 0 || job == jobs_.end())
    return Conflict("slot " + std::to_string(slot) + " runs no request", "slot_idle");
  std::int64_t n_tokens = static_cast<std::int64_t>(job->second->prompt.size());
  {
    std::lock_guard jl(job->second->mu);
    n_tokens += job->second->n_generated;
  }
  Status s = scheduler_.Preempt(t, PreemptReason::kRequest);
  if (s.code() == Status::Code::kInvalidArgument) return Conflict(s.message(), "not_preemptible");
  if (!s.ok()) return ApiError::Internal(s.message());
  std::fprintf(stderr, "serve: slot %d preempted (request %s)\n", slot, job->second->id.c_str());
  return nlohmann::json{{"id_slot", slot}, {"preempted", job->second->id}, {"n_tokens", n_tokens}};
}

EngineDriver::SlotAnswer EngineDriver::SaveSlotNow(int slot, const std::string& path,
                                                   const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  auto it = kept_.find(slot);
  if (it == kept_.end())
    return Conflict("slot " + std::to_string(slot) +
                        " holds no finished conversation (send a request with \"lockstep\": "
                        "{\"keep\": true})",
                    "slot_not_kept");
  Result<ConversationState> st = scheduler_.ExportConversation(it->second.ticket);
  if (!st.ok()) return ApiError::Internal(st.status().message());
  Result<std::string> bytes = EncodeConversation(engine_, *st);
  if (!bytes.ok()) return FileError(bytes.status(), path, name);
  Status w = WriteFileAtomic(path, std::string_view(*bytes));
  if (!w.ok()) return FileError(w, path, name);
  std::fprintf(stderr, "serve: slot %d saved (%zu tokens, request %s)\n", slot, st->tokens.size(),
               it->second.id.c_str());
  return nlohmann::json{{"id_slot", slot},
                        {"filename", name},
                        {"n_saved", st->tokens.size()},
                        {"n_written", bytes->size()},
                        {"timings", {{"save_ms", MsSince(t0)}}}};
}

EngineDriver::SlotAnswer EngineDriver::RestoreSlotNow(int slot, const std::string& bytes_in,
                                                      const std::string& name) {
  const std::string& path = name;  // (the bytes were read on the HTTP thread: ReadSlotFile)
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [t, job] : jobs_)
    if (job->slot == slot)
      return Conflict("slot " + std::to_string(slot) + " is busy", "slot_busy");
  if (kept_.count(slot))
    return Conflict("slot " + std::to_string(slot) + " holds a conversation (erase it first)",
                    "slot_not_free");
  const std::string* bytes = &bytes_in;
  Result<ConversationState> st = DecodeConversation(*bytes, engine_);
  if (!st.ok()) return FileError(st.status(), path, name);
  Result<Ticket> t = scheduler_.ImportConversation(*st, slot);
  if (!t.ok()) {
    if (t.status().code() == Status::Code::kRuntime)
      return Conflict("slot " + std::to_string(slot) + ": " + t.status().message(),
                      "slot_not_free");
    return FileError(t.status(), path, name);
  }
  Kept& k = kept_[slot];
  k.ticket = *t;
  k.tokens = st->tokens;
  k.id = st->id;
  k.since = Clock::now();
  released_.erase(slot);
  CapKept();
  std::fprintf(stderr, "serve: slot %d restored (%zu tokens)\n", slot, st->tokens.size());
  return nlohmann::json{{"id_slot", slot},
                        {"filename", name},
                        {"n_restored", st->tokens.size()},
                        {"n_read", bytes->size()},
                        {"timings", {{"restore_ms", MsSince(t0)}}}};
}

EngineDriver::SlotAnswer EngineDriver::EraseSlotNow(int slot) {
  for (const auto& [t, job] : jobs_)
    if (job->slot == slot)
      return Conflict("slot " + std::to_string(slot) + " is busy", "slot_busy");
  auto it = kept_.find(slot);
  std::size_t n = 0;
  if (it != kept_.end()) {
    n = it->second.tokens.size();
    Status s = ReleaseKept(slot, "erased");
    if (!s.ok()) return ApiError::Internal(s.message());
  }
  return nlohmann::json{{"id_slot", slot}, {"n_erased", n}};
}

Status EngineDriver::ReleaseKept(int slot, const std::string& reason) {
  auto it = kept_.find(slot);
  if (it == kept_.end()) return Status::InvalidArgument("release", "slot holds no conversation");
  LOCKSTEP_RETURN_IF_ERROR(scheduler_.Release(it->second.ticket));
  std::fprintf(stderr, "serve: slot %d released (%s, %zu tokens, request %s)\n", slot,
               reason.c_str(), it->second.tokens.size(), it->second.id.c_str());
  released_[slot] = {reason, it->second.id};
  kept_.erase(it);
  metrics_.CountKeptRelease(reason);
  return Status::Ok();
}

int EngineDriver::LruKept() const {
  auto lru = kept_.begin();
  for (auto it = kept_.begin(); it != kept_.end(); ++it)
    if (it->second.since < lru->second.since) lru = it;
  return lru->first;
}

void EngineDriver::CapKept() {
  while (keep_.max >= 0 && static_cast<int>(kept_.size()) > keep_.max)
    if (!ReleaseKept(LruKept(), "cap").ok()) return;
}

void EngineDriver::ReclaimKept(bool stalled) {
  if (keep_.idle_s > 0) {
    const Clock::duration idle = IdleLimit();
    const Clock::time_point now = Clock::now();
    std::vector<int> due;
    for (const auto& [slot, k] : kept_)
      if (now >= k.since + idle) due.push_back(slot);
    for (int slot : due) (void)ReleaseKept(slot, "idle");
  }
  // Requests in the queue are new ones (a continuation takes its own slot at once); those beyond
  // the free slots would wait on held state: each gets a kept conversation's slot, admitted at
  // the coming step.
  const SchedulerCounters& c = scheduler_.counters();
  int short_by = c.queue_depth - (n_slots_ - c.live);
  // A step that ran nothing while requests wait beside free slots: admission refused the queue's
  // head for memory (--memory-mib), which only the kept conversations' reservations can give.
  if (stalled && c.queue_depth > 0 && short_by <= 0) short_by = 1;
  for (; short_by > 0 && !kept_.empty(); --short_by)
    if (!ReleaseKept(LruKept(), "evicted").ok()) return;
}

ApiError EngineDriver::NotKept(int slot) const {
  const std::string s = "slot " + std::to_string(slot);
  auto r = released_.find(slot);
  if (r == released_.end())
    return Conflict(s + " holds no conversation to continue (\"lockstep\": {\"keep\": true}, or "
                        "POST /slots/{id}?action=restore)",
                    "slot_not_kept");
  const std::string& why = r->second.reason;
  const std::string detail =
      why == "evicted" ? "a new request needed its slot"
      : why == "idle"  ? "not continued for --keep-idle " + fmt::format("{}", keep_.idle_s) + " s"
      : why == "cap"   ? "more than --keep-max " + std::to_string(keep_.max) + " kept"
                       : "POST /slots/" + std::to_string(slot) + "?action=erase";
  return Conflict(s + "'s conversation (request " + r->second.id + ") was released (" + why + ": " +
                      detail +
                      "); resend the whole conversation without id_slot (with --prefix-cache on, "
                      "what it cached of it is reused)",
                  "slot_not_kept");
}

bool EngineDriver::ContinueKept(const ServeJobPtr& job) {
  const int slot = job->req.id_slot;
  auto it = kept_.find(slot);
  if (it == kept_.end()) {
    Refuse(job, NotKept(slot));
    return false;
  }
  const std::vector<std::int32_t>& have = it->second.tokens;
  if (job->prompt.size() <= have.size() ||
      !std::equal(have.begin(), have.end(), job->prompt.begin())) {
    Refuse(job, ApiError::BadRequest(
                    "the prompt must be slot " + std::to_string(slot) + "'s " +
                        std::to_string(have.size()) +
                        " tokens followed by at least one more (GET /slots shows n_tokens)",
                    "prompt", "prompt_not_continuation"));
    return false;
  }
  std::vector<std::int32_t> more(job->prompt.begin() + static_cast<std::ptrdiff_t>(have.size()),
                                 job->prompt.end());
  Result<Ticket> t = scheduler_.Continue(it->second.ticket, std::move(more), job->options,
                                         &job->hooks, job->req.keep);
  if (!t.ok()) {
    Refuse(job, ApiError::BadRequest(t.status().message(), "id_slot"));
    return false;
  }
  job->slot_reused = static_cast<std::int64_t>(have.size()) - 1;
  kept_.erase(it);
  metrics_.CountKeptRelease("continued");
  job->slot = slot;
  Accept(job, *t);
  return true;
}

}  // namespace lockstep
