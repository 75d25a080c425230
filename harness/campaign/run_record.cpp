#include "lockstep/harness/run_record.h"

#include "lockstep/harness/campaign.h"

namespace lockstep {

std::string RunPaths::ArmDir(std::string_view arm) const {
  return dir_ + "/arms/" + std::string(arm);
}

std::string RunPaths::RepeatDir(const ArmSpec& arm, int repeat) const {
  std::string d = ArmDir(arm.name);
  if (arm.mode == "timing") d += "/r" + std::to_string(repeat);
  return d;
}

std::string RunPaths::ArmFile(std::string_view arm, std::string_view file) const {
  return ArmDir(arm) + "/" + std::string(file);
}

std::string RunPaths::FirstRunFile(const ArmSpec& arm, std::string_view file) const {
  return RepeatDir(arm, 0) + "/" + std::string(file);
}

std::string RunPaths::Compare(std::string_view arm, std::string_view ext) const {
  return dir_ + "/compare/" + std::string(arm) + std::string(ext);
}

}  // namespace lockstep
