// A planted duplicate for Layout.DuplicateFunctionsFindsAPlant: Spread is defined again in b.cpp.
namespace plant {
double Spread(const double* v, int n) {
  double lo = v[0], hi = v[0];
  for (int i = 1; i < n; ++i) {
    if (v[i] < lo) lo = v[i];
    if (v[i] > hi) hi = v[i];
  }
  return hi - lo;
}
}  // namespace plant
