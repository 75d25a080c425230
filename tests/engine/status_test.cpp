#include "lockstep/engine/status.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(Status, ExitCodesFollowTheContract) {
  EXPECT_EQ(Status::Ok().exit_code(), 0);
  EXPECT_EQ(Status::GateFailed("gate").exit_code(), 1);
  EXPECT_EQ(Status::InvalidArgument("x").exit_code(), 2);
  EXPECT_EQ(Status::Corruption("x").exit_code(), 2);
  EXPECT_EQ(Status::NotFound("x").exit_code(), 2);
  EXPECT_EQ(Status::NotSupported("x").exit_code(), 2);
  EXPECT_EQ(Status::IOError("x").exit_code(), 3);
  EXPECT_EQ(Status::Runtime("x").exit_code(), 3);
}

TEST(Status, MessagesNameTheThingAndKeepContext) {
  Status s = Status::Corruption("tensor 'a.b'", "expected [2, 3], got [3, 2]");
  EXPECT_EQ(s.message(), "tensor 'a.b': expected [2, 3], got [3, 2]");
  Status w = s.WithContext("loading '/m'");
  EXPECT_EQ(w.code(), Status::Code::kCorruption);
  EXPECT_EQ(w.message(), "loading '/m': tensor 'a.b': expected [2, 3], got [3, 2]");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("x", "odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  LOCKSTEP_ASSIGN_OR_RETURN(int h, Half(x));
  LOCKSTEP_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(Status, ResultPropagation) {
  int q = 0;
  EXPECT_TRUE(Quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = Quarter(6, &q);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "x: odd");
}

}  // namespace
}  // namespace lockstep
