#include "serve/lockstep_endpoints.h"

#include <fcntl.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <vector>

#include "lockstep/engine/digest.h"
#include "lockstep/instrument/fingerprint.h"
#include "serve/completion_response.h"
#include "serve/completions_handler.h"
#include "serve/http_server.h"

namespace lockstep {

namespace {

constexpr std::size_t kBlock = 256 * 1024;

// An open export file shared by the content provider's calls; closed by the last one.
struct OpenFile {
  int fd = -1;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void HandleExportDownload(const ServeContext& ctx, const httplib::Request& req,
                          httplib::Response& res) {
  const std::string name = req.matches.size() > 1 ? std::string(req.matches[1]) : std::string();
  ExportEntry entry;
  switch (ctx.exports.Lookup(name, &entry)) {
    case ExportRegistry::State::kUnknown:
      return SendError(
          res, ApiError::NotFound("no export '" + name + "' on this server", "export_not_found"));
    case ExportRegistry::State::kWriting: {
      ApiError e = ApiError::NotFound("the export '" + name + "' is still being written",
                                      "export_not_finished");
      e.status = 409;
      return SendError(res, e);
    }
    case ExportRegistry::State::kFinished:
      break;
  }
  // Opened now, so the bytes served are the file that was hashed even if the name is replaced
  // or removed while the body is being sent.
  auto file = std::make_shared<OpenFile>();
  file->fd = ::open(entry.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st {};
  if (file->fd < 0 || ::fstat(file->fd, &st) != 0 || !SameFileAsHashed(entry, st)) {
    std::fprintf(stderr, "serve: export %s: gone or changed since it was finished\n", name.c_str());
    return SendError(res, ApiError::NotFound("the export '" + name + "' is no longer available",
                                             "export_not_found"));
  }
  res.set_header("X-Lockstep-Sha256", entry.sha256);
  res.set_content_provider(
      static_cast<std::size_t>(entry.bytes), "application/x-hdf5",
      [file](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
        std::vector<char> buf(std::min(length, kBlock));
        const ssize_t n = ::pread(file->fd, buf.data(), buf.size(), static_cast<off_t>(offset));
        if (n <= 0) return false;  // a read error ends the connection: the client sees it short
        return sink.write(buf.data(), static_cast<std::size_t>(n));
      });
}

void HandleInfo(const ServeContext& ctx, httplib::Response& res) {
  if (!ctx.ready) return SendError(res, ApiError::Unavailable("loading the model", "loading"));
  const std::string config = ctx.engine_config.ToJson();
  nlohmann::json info;
  info["engine_instance"] = ctx.engine_instance;
  info["config"] = nlohmann::json::parse(config, nullptr, false);
  info["config_sha256"] = Sha256Hex(config);
  info["model"] = {{"name", ctx.limits.model_name},
                   {"sha256", ctx.model_sha256},
                   {"n_vocab", ctx.limits.n_vocab}};
  info["executable_sha256"] = ctx.executable_sha256;
  info["version"] = ctx.opts.version;
  info["commit"] = ctx.opts.commit;
  info["started_unix"] = ctx.started_unix;
  info["completions_run"] = ctx.metrics.CompletionsRun();
  info["slots"] = ctx.engine_config.slots;
  res.set_content(Dump(info), "application/json");
}

Result<std::string> NewEngineInstance() {
  unsigned char bytes[16] = {};
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  const bool ok = f != nullptr && std::fread(bytes, 1, sizeof(bytes), f) == sizeof(bytes);
  if (f) std::fclose(f);
  if (!ok) return Status::IOError("engine instance", "cannot read 16 bytes of /dev/urandom");
  return HexOf(bytes, sizeof(bytes));
}

}  // namespace lockstep
