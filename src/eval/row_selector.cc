#include "src/eval/row_selector.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace loom {
namespace {

Status ParseInt(const std::string& selector, const std::string& v,
                int64_t* out) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size())
    return InvalidArgumentError("selector '" + selector + "': '" + v +
                                "' is not an integer");
  *out = x;
  return Status();
}

Status ParsePositions(const std::string& text, RowSelector* s) {
  const std::string rest = text.substr(4);
  size_t start = 0;
  while (start <= rest.size()) {
    const size_t comma = rest.find(',', start);
    int64_t v;
    RETURN_IF_ERROR(ParseInt(
        text,
        rest.substr(start, comma == std::string::npos ? std::string::npos
                                                      : comma - start),
        &v));
    s->positions.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return Status();
}

Status ParseSpan(const std::string& text, RowSelector* s) {
  const std::string rest = text.substr(5);
  const size_t colon = rest.find(':');
  if (colon == std::string::npos)
    return InvalidArgumentError("selector '" + text + "': expected span:A:B");
  RETURN_IF_ERROR(ParseInt(text, rest.substr(0, colon), &s->span_begin));
  RETURN_IF_ERROR(ParseInt(text, rest.substr(colon + 1), &s->span_end));
  if (s->span_begin >= 0 && s->span_end >= 0 && s->span_begin >= s->span_end)
    return InvalidArgumentError("selector '" + text +
                                "': empty span (A must be < B)");
  return Status();
}

}  // namespace

std::string_view SelectorKindName(RowSelector::Kind k) {
  switch (k) {
    case RowSelector::Kind::kLast:
      return "last";
    case RowSelector::Kind::kFirst:
      return "first";
    case RowSelector::Kind::kMean:
      return "mean";
    case RowSelector::Kind::kMax:
      return "max";
    case RowSelector::Kind::kAll:
      return "all";
    case RowSelector::Kind::kPos:
      return "pos";
    case RowSelector::Kind::kSpan:
      return "span";
  }
  return "?";
}

StatusOr<RowSelector> ParseRowSelector(const std::string& text) {
  RowSelector s;
  s.spec = text;
  if (text == "last") {
    s.kind = RowSelector::Kind::kLast;
  } else if (text == "first") {
    s.kind = RowSelector::Kind::kFirst;
  } else if (text == "mean") {
    s.kind = RowSelector::Kind::kMean;
  } else if (text == "max") {
    s.kind = RowSelector::Kind::kMax;
  } else if (text == "all") {
    s.kind = RowSelector::Kind::kAll;
  } else if (text.rfind("pos:", 0) == 0) {
    s.kind = RowSelector::Kind::kPos;
    RETURN_IF_ERROR(ParsePositions(text, &s));
  } else if (text.rfind("span:", 0) == 0) {
    s.kind = RowSelector::Kind::kSpan;
    RETURN_IF_ERROR(ParseSpan(text, &s));
  } else {
    return InvalidArgumentError(
        "selector '" + text +
        "': expected last, first, mean, max, all, pos:I[,J...] or span:A:B");
  }
  s.file_name = std::string(SelectorKindName(s.kind));
  for (int64_t p : s.positions) s.file_name += "_" + std::to_string(p);
  if (s.kind == RowSelector::Kind::kSpan)
    s.file_name +=
        "_" + std::to_string(s.span_begin) + "_" + std::to_string(s.span_end);
  return s;
}

bool ResolveSpan(const RowSelector& s, int64_t len, SpanRange* r) {
  if (s.kind != RowSelector::Kind::kSpan) {
    *r = {0, len};
    return true;
  }
  const int64_t a = s.span_begin < 0 ? len + s.span_begin : s.span_begin;
  const int64_t b = s.span_end < 0 ? len + s.span_end : s.span_end;
  if (a < 0 || b > len || a >= b) return false;
  *r = {a, b};
  return true;
}

Status CheckSelectorCanFit(const RowSelector& s, int64_t most_rows) {
  const auto refuse = [&](const std::string& what) {
    return OutOfRangeError("selector '" + s.spec + "': " + what +
                           " is outside the at most " +
                           std::to_string(most_rows) +
                           " rows this request captures (the prompt, then "
                           "each generated token but the last)");
  };
  if (s.kind == RowSelector::Kind::kPos)
    for (const int64_t q : s.positions) {
      const int64_t p = ResolvePosition(q, most_rows);
      if (p < 0 || p >= most_rows)
        return refuse("position " + std::to_string(q));
    }
  SpanRange r;
  if (s.kind == RowSelector::Kind::kSpan && !ResolveSpan(s, most_rows, &r))
    return refuse("the span");
  return Status();
}

StatusOr<std::vector<float>> SelectRows(const RowSelector& s, const float* rows,
                                        int64_t n, int64_t cols,
                                        int64_t* out_rows) {
  using Kind = RowSelector::Kind;
  std::vector<float> out;
  auto take = [&](int64_t r) {
    out.insert(out.end(), rows + r * cols, rows + (r + 1) * cols);
  };
  if (n <= 0)
    return OutOfRangeError("selector " + s.spec + ": no rows were captured");
  switch (s.kind) {
    case Kind::kLast:
      take(n - 1);
      break;
    case Kind::kFirst:
      take(0);
      break;
    case Kind::kMean:
    case Kind::kMax:
      out.resize(static_cast<size_t>(cols));
      for (int64_t c = 0; c < cols; ++c) {
        double acc = s.kind == Kind::kMean ? 0.0 : -INFINITY;
        for (int64_t r = 0; r < n; ++r)
          acc = s.kind == Kind::kMean
                    ? acc + rows[r * cols + c]
                    : std::max<double>(acc, rows[r * cols + c]);
        out[static_cast<size_t>(c)] =
            static_cast<float>(s.kind == Kind::kMean ? acc / n : acc);
      }
      break;
    case Kind::kPos:
      for (int64_t q : s.positions) {
        const int64_t p = ResolvePosition(q, n);
        if (p < 0 || p >= n)
          return OutOfRangeError("selector " + s.spec + ": position " +
                                 std::to_string(q) + " is outside the " +
                                 std::to_string(n) + " rows");
        take(p);
      }
      break;
    case Kind::kAll:
    case Kind::kSpan: {
      SpanRange range;
      if (!ResolveSpan(s, n, &range))
        return OutOfRangeError("selector " + s.spec + " is outside the " +
                               std::to_string(n) + " rows");
      for (int64_t r = range.begin; r < range.end; ++r) take(r);
      break;
    }
  }
  *out_rows = static_cast<int64_t>(out.size()) / std::max<int64_t>(cols, 1);
  return out;
}

}  // namespace loom
