// The evaluator of data/jinja.h: statements write into one output string; expressions follow Python's rules
// (data/jinja_value.h); scopes follow jinja2's (a for loop and a macro each get their own, `set` writes to the
// innermost, `namespace()` objects are shared so loops can update them).
#include "data/jinja.h"

#include <cmath>
#include <ctime>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja_builtins.h"

namespace df::jinja {

namespace {

// An error that already names the template line, so enclosing statements pass it on unchanged.
struct Located : Error {
  using Error::Error;
};

using Frame = std::unordered_map<std::string, Value>;

// Bounds on one render, so that a hostile template (exponential macro recursion, range(10**12), 'x' * 10**12)
// fails with an error instead of running or allocating without end. Chat templates use a tiny fraction.
constexpr int64_t kMaxSteps = 5'000'000;          // statements executed
constexpr int64_t kMaxItems = 10'000'000;         // range() length
constexpr size_t kMaxText = size_t(1) << 28;      // bytes of one string (256 MiB)

Value builtin(const char* name) {
  Value v;
  v.kind = Value::Kind::builtin;
  v.s = name;
  return v;
}

Value undefined_named(const std::string& what) {
  Value v;
  v.s = what;  // an undefined value keeps what it was, for the error if it is used
  return v;
}

int64_t as_int(const Value& v, const char* what) {
  DF_CHECK(v.kind == Value::Kind::integer || v.kind == Value::Kind::boolean, "%s must be an integer, not '%s'", what,
           value_type_name(v));
  return v.kind == Value::Kind::boolean ? int64_t(v.b) : v.i;
}

// Python slice bounds for a sequence of n items.
std::vector<size_t> slice_indices(int64_t n, const Value* lo, const Value* hi, const Value* st) {
  const int64_t step = st && st->kind != Value::Kind::none ? as_int(*st, "a slice step") : 1;
  DF_CHECK(step != 0, "slice step cannot be zero");
  auto bound = [&](const Value* b, int64_t dflt) {
    if (!b || b->kind == Value::Kind::none) return dflt;
    int64_t x = as_int(*b, "a slice index");
    if (x < 0) x += n;
    if (step > 0) return std::min(std::max<int64_t>(x, 0), n);
    return std::min(std::max<int64_t>(x, -1), n - 1);
  };
  const int64_t start = bound(lo, step > 0 ? 0 : n - 1), stop = bound(hi, step > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
    out.push_back(size_t(k));
    if (__builtin_add_overflow(k, step, &k)) break;
  }
  return out;
}

Value arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined())
    DF_FAIL("'%s' is undefined", (a.is_undefined() ? a : b).s.empty() ? "a value" : (a.is_undefined() ? a : b).s.c_str());
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.kind == Value::Kind::list && b.kind == Value::Kind::list) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l));
    }
    DF_CHECK(!a.is_string() && !b.is_string(), "can only concatenate str (not \"%s\") to str",
             value_type_name(a.is_string() ? b : a));
  }
  if (op == "*" && (a.is_string() || b.is_string())) {
    const Value& s = a.is_string() ? a : b;
    const int64_t n = as_int(a.is_string() ? b : a, "a string repeat count");
    DF_CHECK(n <= 0 || s.s.empty() || uint64_t(n) <= kMaxText / s.s.size(), "a string repeated to more than %zu bytes",
             kMaxText);
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += s.s;
    return Value::string(out);
  }
  DF_CHECK(a.is_number() && b.is_number(), "unsupported operand type(s) for %s: '%s' and '%s'", op.c_str(),
           value_type_name(a), value_type_name(b));
  const bool ints = a.kind != Value::Kind::floating && b.kind != Value::Kind::floating;
  if (ints && op != "/") {
    const int64_t x = as_int(a, "an operand"), y = as_int(b, "an operand");
    int64_t r = 0;
    // Python's integers do not overflow; 64-bit ones that would are refused rather than wrapped.
    const char* overflow = "integer overflow in %s (this renderer has 64-bit integers)";
    if (op == "+") {
      DF_CHECK(!__builtin_add_overflow(x, y, &r), overflow, op.c_str());
      return Value::integer(r);
    }
    if (op == "-") {
      DF_CHECK(!__builtin_sub_overflow(x, y, &r), overflow, op.c_str());
      return Value::integer(r);
    }
    if (op == "*") {
      DF_CHECK(!__builtin_mul_overflow(x, y, &r), overflow, op.c_str());
      return Value::integer(r);
    }
    if (op == "//" || op == "%") {
      DF_CHECK(y != 0, "integer division or modulo by zero");
      DF_CHECK(!(x == INT64_MIN && y == -1), overflow, op.c_str());
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (op == "**" && y >= 0) {
      if (x == 0 || x == 1) return Value::integer(y == 0 ? 1 : x);
      if (x == -1) return Value::integer(y % 2 ? -1 : 1);
      r = 1;  // |x| >= 2 overflows within 63 factors
      for (int64_t k = 0; k < y; ++k) DF_CHECK(!__builtin_mul_overflow(r, x, &r), overflow, op.c_str());
      return Value::integer(r);
    }
  }
  const double x = value_as_double(a), y = value_as_double(b);
  if (op == "+") return Value::floating(x + y);
  if (op == "-") return Value::floating(x - y);
  if (op == "*") return Value::floating(x * y);
  if (op == "**") return Value::floating(std::pow(x, y));
  DF_CHECK(y != 0, "float division by zero");
  if (op == "/") return Value::floating(x / y);
  const double q = std::floor(x / y);
  return Value::floating(op == "//" ? q : x - q * y);
}

class Renderer {
 public:
  explicit Renderer(const std::string& name) : name_(name) {}

  std::string run(const Body& body, Frame globals) {
    globals_ = std::move(globals);
    std::string out;
    out_ = &out;
    const Flow f = exec(body);
    DF_CHECK(f == Flow::normal, "%s: {%% break %%} or {%% continue %%} outside a for loop", name_.c_str());
    return out;
  }

 private:
  enum class Flow { normal, break_, continue_ };

  std::string at(int line) const { return name_ + " line " + std::to_string(line) + ": "; }

  Frame& scope() { return frames_.empty() ? globals_ : frames_.back(); }

  Value lookup(const std::string& n) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    auto g = globals_.find(n);
    return g != globals_.end() ? g->second : undefined_named(n);
  }

  Flow exec(const Body& body) {
    for (const StmtPtr& s : body) {
      Flow f;
      try {
        f = exec_one(*s);
      } catch (const Located&) {
        throw;
      } catch (const Error& e) {
        throw Located(at(s->line) + e.what());
      }
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec_one(const Stmt& s) {
    DF_CHECK(++steps_ <= kMaxSteps, "the render took more than %lld steps", (long long)kMaxSteps);
    DF_CHECK(out_->size() <= kMaxText, "the rendered text passed %zu bytes", kMaxText);
    switch (s.kind) {
      case Stmt::Kind::text: *out_ += s.text; return Flow::normal;
      case Stmt::Kind::output: *out_ += value_str(eval(*s.expr)); return Flow::normal;
      case Stmt::Kind::if_:
        for (size_t k = 0; k < s.branches.size(); ++k)
          if (!s.conds[k] || value_truthy(eval(*s.conds[k]))) return exec(s.branches[k]);
        return Flow::normal;
      case Stmt::Kind::for_: return exec_for(s);
      case Stmt::Kind::set: assign(s, eval(*s.expr)); return Flow::normal;
      case Stmt::Kind::set_block: assign(s, Value::string(capture(s.branches[0]))); return Flow::normal;
      case Stmt::Kind::macro: {
        Value m;
        m.kind = Value::Kind::macro;
        m.macro = s.macro.get();
        scope()[s.macro->name] = m;
        return Flow::normal;
      }
      case Stmt::Kind::break_: return Flow::break_;
      case Stmt::Kind::continue_: return Flow::continue_;
      case Stmt::Kind::generation: return exec(s.branches[0]);
    }
    return Flow::normal;
  }

  std::string capture(const Body& body) {
    std::string text, *saved = out_;
    out_ = &text;
    const Flow f = exec(body);
    out_ = saved;
    DF_CHECK(f == Flow::normal, "{%% break %%} or {%% continue %%} outside a for loop");
    return text;
  }

  void bind(Frame& frame, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      frame[targets[0]] = v;
      return;
    }
    DF_CHECK(v.kind == Value::Kind::list && v.list->size() == targets.size(),
             "cannot unpack a '%s' of %zu items into %zu names", value_type_name(v),
             v.kind == Value::Kind::list ? v.list->size() : size_t(0), targets.size());
    for (size_t k = 0; k < targets.size(); ++k) frame[targets[k]] = (*v.list)[k];
  }

  void assign(const Stmt& s, const Value& v) {
    if (s.target_attr.empty()) {
      bind(scope(), s.targets, v);
      return;
    }
    Value ns = lookup(s.targets[0]);
    DF_CHECK(ns.kind == Value::Kind::ns, "cannot assign attribute '%s' on '%s', which is a %s, not a namespace()",
             s.target_attr.c_str(), s.targets[0].c_str(), value_type_name(ns));
    for (auto& kv : *ns.dict)
      if (kv.first == s.target_attr) {
        kv.second = v;
        return;
      }
    ns.dict->emplace_back(s.target_attr, v);
  }

  Flow exec_for(const Stmt& s) {
    const Value seq = eval(*s.expr);
    List items;
    switch (seq.kind) {
      case Value::Kind::undefined: break;
      case Value::Kind::list: items = *seq.list; break;
      case Value::Kind::dict:
        for (const auto& kv : *seq.dict) items.push_back(Value::string(kv.first));
        break;
      case Value::Kind::string:
        for (char32_t c : utf8_decode(seq.s)) items.push_back(Value::string(utf8_encode(std::u32string(1, c))));
        break;
      default: DF_FAIL("'%s' object is not iterable", value_type_name(seq));
    }
    frames_.emplace_back();
    if (s.filter) {
      List kept;
      for (const Value& it : items) {
        bind(frames_.back(), s.targets, it);
        if (value_truthy(eval(*s.filter))) kept.push_back(it);
      }
      items.swap(kept);
    }
    Flow result = Flow::normal;
    const int64_t n = int64_t(items.size());
    for (int64_t k = 0; k < n; ++k) {
      Frame& f = frames_.back();
      bind(f, s.targets, items[size_t(k)]);
      Dict loop = {{"index", Value::integer(k + 1)},      {"index0", Value::integer(k)},
                   {"revindex", Value::integer(n - k)},   {"revindex0", Value::integer(n - k - 1)},
                   {"first", Value::boolean(k == 0)},     {"last", Value::boolean(k == n - 1)},
                   {"length", Value::integer(n)},         {"depth", Value::integer(1)},
                   {"depth0", Value::integer(0)}};
      if (k > 0) loop.emplace_back("previtem", items[size_t(k - 1)]);
      if (k + 1 < n) loop.emplace_back("nextitem", items[size_t(k + 1)]);
      f["loop"] = Value::make_dict(std::move(loop));
      const Flow fl = exec(s.branches[0]);
      if (fl == Flow::break_) break;
    }
    if (n == 0) result = exec(s.branches[1]);
    frames_.pop_back();
    return result;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::list: {
        List l;
        for (const ExprPtr& x : e.items) l.push_back(eval(*x));
        return e.op == "tuple" ? Value::make_tuple(std::move(l)) : Value::make_list(std::move(l));
      }
      case Expr::Kind::dict: {
        Dict d;
        for (size_t k = 0; k < e.items.size(); ++k) d.emplace_back(e.keys[k], eval(*e.items[k]));
        return Value::make_dict(std::move(d));
      }
      case Expr::Kind::attr: return attribute(eval(*e.items[0]), e.name);
      case Expr::Kind::index: return item(eval(*e.items[0]), eval(*e.items[1]));
      case Expr::Kind::slice: return slice(e);
      case Expr::Kind::call: return call(e);
      case Expr::Kind::filter: {
        const Value v = eval(*e.items[0]);
        std::vector<Value> args;
        for (size_t k = 1; k < e.items.size(); ++k) args.push_back(eval(*e.items[k]));
        return jinja_filter_apply(e.name, v, args, e.kwarg_names);
      }
      case Expr::Kind::test: {
        const Value v = eval(*e.items[0]);
        std::vector<Value> args;
        for (size_t k = 1; k < e.items.size(); ++k) args.push_back(eval(*e.items[k]));
        return Value::boolean(jinja_test_apply(e.name, v, args) != e.negate);
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.items[0]);
        if (e.op == "not") return Value::boolean(!value_truthy(v));
        DF_CHECK(v.is_number(), "bad operand type for unary %s: '%s'", e.op.c_str(), value_type_name(v));
        if (e.op == "+") return v.kind == Value::Kind::boolean ? Value::integer(v.b) : v;
        if (v.kind == Value::Kind::floating) return Value::floating(-v.f);
        DF_CHECK(as_int(v, "an operand") != INT64_MIN, "integer overflow in unary -");
        return Value::integer(-as_int(v, "an operand"));
      }
      case Expr::Kind::binary: return binary(e);
      case Expr::Kind::ternary:
        if (value_truthy(eval(*e.items[1]))) return eval(*e.items[0]);
        return e.items[2] ? eval(*e.items[2]) : Value();
    }
    return Value();
  }

  Value binary(const Expr& e) {
    const std::string& op = e.op;
    const Value a = eval(*e.items[0]);
    if (op == "and") return value_truthy(a) ? eval(*e.items[1]) : a;
    if (op == "or") return value_truthy(a) ? a : eval(*e.items[1]);
    const Value b = eval(*e.items[1]);
    if (op == "==") return Value::boolean(value_equal(a, b));
    if (op == "!=") return Value::boolean(!value_equal(a, b));
    if (op == "<") return Value::boolean(value_less(a, b));
    if (op == ">") return Value::boolean(value_less(b, a));
    if (op == "<=") return Value::boolean(!value_less(b, a));
    if (op == ">=") return Value::boolean(!value_less(a, b));
    if (op == "in") return Value::boolean(jinja_contains(b, a));
    if (op == "not in") return Value::boolean(!jinja_contains(b, a));
    if (op == "~") return Value::string(value_str(a) + value_str(b));
    DF_CHECK(!(op == "%" && a.is_string()), "string formatting with '%%' is not supported by this renderer");
    return arith(op, a, b);
  }

  static Value attribute(const Value& obj, const std::string& n) {
    if (obj.is_undefined())
      DF_FAIL("'%s' is undefined (reading its attribute '%s')", obj.s.empty() ? "a value" : obj.s.c_str(), n.c_str());
    if (const Value* f = obj.find(n)) return *f;
    return undefined_named(std::string("'") + value_type_name(obj) + " object' has no attribute '" + n + "'");
  }

  static Value item(const Value& obj, const Value& key) {
    if (obj.is_undefined())
      DF_FAIL("'%s' is undefined (taking an item of it)", obj.s.empty() ? "a value" : obj.s.c_str());
    if (key.is_string()) return attribute(obj, key.s);
    if ((obj.kind == Value::Kind::list || obj.is_string()) &&
        (key.kind == Value::Kind::integer || key.kind == Value::Kind::boolean)) {
      const std::u32string u = obj.is_string() ? utf8_decode(obj.s) : std::u32string();
      const int64_t n = obj.is_string() ? int64_t(u.size()) : int64_t(obj.list->size());
      int64_t k = as_int(key, "an index");
      if (k < 0) k += n;
      if (k < 0 || k >= n) return undefined_named("an index out of range");
      return obj.is_string() ? Value::string(utf8_encode(u.substr(size_t(k), 1))) : (*obj.list)[size_t(k)];
    }
    return undefined_named(std::string("an item of a '") + value_type_name(obj) + "'");
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.items[0]);
    Value parts[3];
    for (int k = 0; k < 3; ++k) parts[k] = e.items[size_t(k) + 1] ? eval(*e.items[size_t(k) + 1]) : Value::none_value();
    if (obj.is_string()) {
      const std::u32string u = utf8_decode(obj.s);
      std::u32string r;
      for (size_t k : slice_indices(int64_t(u.size()), &parts[0], &parts[1], &parts[2])) r += u[k];
      return Value::string(utf8_encode(r));
    }
    DF_CHECK(obj.kind == Value::Kind::list, "'%s' object is not subscriptable with a slice", value_type_name(obj));
    List l;
    for (size_t k : slice_indices(int64_t(obj.list->size()), &parts[0], &parts[1], &parts[2]))
      l.push_back((*obj.list)[k]);
    return Value::make_list(std::move(l));
  }

  Value call(const Expr& e) {
    const size_t nkw = e.kwarg_names.size(), npos = e.items.size() - 1 - nkw;
    std::vector<Value> args;
    for (size_t k = 1; k < e.items.size(); ++k) args.push_back(eval(*e.items[k]));
    const Expr& callee = *e.items[0];
    if (callee.kind == Expr::Kind::attr) {
      const Value obj = eval(*callee.items[0]);
      Value out;
      if ((obj.is_string() || obj.is_mapping()) && nkw == 0 && jinja_method_call(obj, callee.name, args, &out))
        return out;
      const Value fn = attribute(obj, callee.name);
      if (fn.kind != Value::Kind::macro && fn.kind != Value::Kind::builtin)
        DF_FAIL("'%s' object has no method '%s' (or this renderer does not implement it)", value_type_name(obj),
                callee.name.c_str());
      return invoke(fn, args, npos, e.kwarg_names);
    }
    return invoke(eval(callee), args, npos, e.kwarg_names);
  }

  Value invoke(const Value& fn, const std::vector<Value>& args, size_t npos, const std::vector<std::string>& kw) {
    if (fn.kind == Value::Kind::macro) return call_macro(*fn.macro, args, npos, kw);
    DF_CHECK(fn.kind == Value::Kind::builtin, "%s is not callable",
             fn.is_undefined() ? ("'" + (fn.s.empty() ? std::string("a value") : fn.s) + "' is undefined and").c_str()
                               : (std::string("a '") + value_type_name(fn) + "'").c_str());
    const std::string& n = fn.s;
    if (n == "raise_exception") {
      DF_CHECK(args.size() == 1 && npos == 1, "raise_exception takes one message");
      DF_FAIL("raise_exception: %s", value_str(args[0]).c_str());
    }
    if (n == "namespace" || n == "dict") {
      Dict d;
      for (size_t k = 0; k < npos; ++k) {
        DF_CHECK(args[k].is_mapping(), "%s() takes keyword arguments or a dict", n.c_str());
        d.insert(d.end(), args[k].dict->begin(), args[k].dict->end());
      }
      for (size_t k = 0; k < kw.size(); ++k) d.emplace_back(kw[k], args[npos + k]);
      Value v = Value::make_dict(std::move(d));
      if (n == "namespace") v.kind = Value::Kind::ns;
      return v;
    }
    DF_CHECK(kw.empty(), "%s() takes no keyword arguments", n.c_str());
    if (n == "range") {
      DF_CHECK(!args.empty() && args.size() <= 3, "range() takes 1 to 3 arguments");
      const int64_t lo = args.size() > 1 ? as_int(args[0], "range()") : 0;
      const int64_t hi = as_int(args.size() > 1 ? args[1] : args[0], "range()");
      const int64_t step = args.size() > 2 ? as_int(args[2], "range()") : 1;
      DF_CHECK(step != 0, "range() step must not be zero");
      DF_CHECK((double(hi) - double(lo)) / double(step) <= double(kMaxItems), "range() of more than %lld items",
               (long long)kMaxItems);
      List l;
      for (int64_t k = lo; step > 0 ? k < hi : k > hi;) {
        l.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, step, &k)) break;
      }
      return Value::make_list(std::move(l));
    }
    if (n == "strftime_now") {
      DF_CHECK(args.size() == 1 && args[0].is_string(), "strftime_now takes one format string");
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[256];
      const size_t len = std::strftime(buf, sizeof buf, args[0].s.c_str(), &tm);
      return Value::string(std::string(buf, len));
    }
    DF_FAIL("the function '%s' is not supported by this renderer", n.c_str());
  }

  Value call_macro(const MacroDef& m, const std::vector<Value>& args, size_t npos, const std::vector<std::string>& kw) {
    DF_CHECK(npos <= m.params.size(), "macro '%s' takes at most %zu arguments, got %zu", m.name.c_str(),
             m.params.size(), npos);
    DF_CHECK(depth_ < 64, "macro '%s': calls nested deeper than 64", m.name.c_str());
    Frame f;
    std::vector<bool> given(m.params.size(), false);
    for (size_t k = 0; k < npos; ++k) {
      f[m.params[k]] = args[k];
      given[k] = true;
    }
    for (size_t k = 0; k < kw.size(); ++k) {
      size_t p = 0;
      while (p < m.params.size() && m.params[p] != kw[k]) ++p;
      DF_CHECK(p < m.params.size(), "macro '%s' has no parameter '%s'", m.name.c_str(), kw[k].c_str());
      DF_CHECK(!given[p], "macro '%s' got parameter '%s' twice", m.name.c_str(), kw[k].c_str());
      f[kw[k]] = args[npos + k];
      given[p] = true;
    }
    std::vector<Frame> saved;  // the caller's scopes: a macro sees the top level and its parameters only
    saved.swap(frames_);
    frames_.push_back(std::move(f));
    const size_t first_default = m.params.size() - m.defaults.size();
    for (size_t p = 0; p < m.params.size(); ++p)
      if (!given[p]) frames_.back()[m.params[p]] = p >= first_default ? eval(*m.defaults[p - first_default]) : Value();
    // An error ends the whole render, so the caller's scopes need restoring only on success.
    ++depth_;
    const std::string text = capture(m.body);
    --depth_;
    frames_.swap(saved);
    return Value::string(text);
  }

  std::string name_;
  Frame globals_;              // the context, the builtins and what the top level sets
  std::vector<Frame> frames_;  // the scopes of the loops and macros being run, innermost last
  std::string* out_ = nullptr;
  int depth_ = 0;
  int64_t steps_ = 0;
};

bool expr_reads(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == Expr::Kind::name && e->name == name) return true;
  for (const ExprPtr& item : e->items)
    if (expr_reads(item.get(), name)) return true;
  return false;
}

bool body_reads(const Body& body, const std::string& name) {
  for (const StmtPtr& s : body) {
    if (expr_reads(s->expr.get(), name) || expr_reads(s->filter.get(), name)) return true;
    if (!s->target_attr.empty() && s->targets[0] == name) return true;  // set ns.attr reads ns
    for (const ExprPtr& c : s->conds)
      if (expr_reads(c.get(), name)) return true;
    for (const Body& b : s->branches)
      if (body_reads(b, name)) return true;
    if (s->macro) {
      for (const ExprPtr& d : s->macro->defaults)
        if (expr_reads(d.get(), name)) return true;
      if (body_reads(s->macro->body, name)) return true;
    }
  }
  return false;
}

}  // namespace

bool Template::reads(const std::string& name) const {
  return body_reads(body_, name);
}

Template::Template(const std::string& source, const std::string& name) : name_(name), body_(jinja_parse(source, name)) {}

std::string Template::render(const nlohmann::ordered_json& context) const {
  DF_CHECK(context.is_object(), "%s: the render context must be a JSON object", name_.c_str());
  Frame globals;
  for (const char* b : {"raise_exception", "namespace", "range", "strftime_now", "dict"}) globals[b] = builtin(b);
  for (auto it = context.begin(); it != context.end(); ++it) globals[it.key()] = value_from_json(it.value());
  try {
    return Renderer(name_).run(body_, std::move(globals));
  } catch (const Located& e) {
    throw Error(e.what());
  }
}

}  // namespace df::jinja
