#include "src/eval/row_selector.h"

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

}  // namespace loom
