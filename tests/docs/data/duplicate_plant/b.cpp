// The second definition of a.cpp's body, under another name and with other comments.
namespace plant {
double Range(const double* v, int n) {
  double lo = v[0], hi = v[0];  // the first value bounds both
  for (int i = 1; i < n; ++i) {
    if (v[i] < lo) lo = v[i];
    if (v[i] > hi) hi = v[i];
  }
  return hi - lo;
}
}  // namespace plant
