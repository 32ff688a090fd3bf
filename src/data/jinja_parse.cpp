// Recursive-descent parser for the Jinja subset of data/jinja_parse.h, over the chunks and tokens of
// data/jinja_lex.h. The grammar and precedence are
// jinja2's (parser.py): conditional < or < and < not < comparisons < + - < ~ < * / // % < ** < unary, with
// filters (`|`) and tests (`is`) binding to the operand before them.
#include "data/jinja_parse.h"

#include <cctype>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "data/jinja_builtins.h"
#include "data/jinja_lex.h"

namespace df::jinja {

namespace {

constexpr int kMaxNesting = 100;  // blocks inside blocks, or expressions inside expressions

class ExprParser {
 public:
  ExprParser(const std::string& src, int line, const std::string& name)
      : where_(name + " line " + std::to_string(line)), line_(line), toks_(jinja_tokenize(src, where_)) {}

  bool at_end() const { return toks_[pos_].t == Tok::T::end; }
  bool is_name(const char* n, size_t ahead = 0) const {
    const Tok& t = toks_[std::min(pos_ + ahead, toks_.size() - 1)];
    return t.t == Tok::T::name && t.s == n;
  }
  bool is_op(const char* o) const { return toks_[pos_].t == Tok::T::op && toks_[pos_].s == o; }
  bool is_comparison() const {
    return is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">=");
  }
  void expect_op(const char* o) {
    DF_CHECK(is_op(o), "%s: expected '%s' but found %s", where_.c_str(), o, describe().c_str());
    ++pos_;
  }
  void expect_end(const char* what) {
    DF_CHECK(at_end(), "%s: unexpected %s after %s", where_.c_str(), describe().c_str(), what);
  }
  std::string name() {
    DF_CHECK(toks_[pos_].t == Tok::T::name, "%s: expected a name but found %s", where_.c_str(), describe().c_str());
    return toks_[pos_++].s;
  }
  void skip() { ++pos_; }
  const std::string& where() const { return where_; }

  ExprPtr expression() { return condexpr(); }

  // `a, b, c` (an implicit tuple) or one expression, as for-loop iterables and set values allow. A for loop's
  // iterable takes no `x if c else y` (jinja2: with_condexpr=False), so its `if` starts the loop filter.
  ExprPtr tuple_or_expression(bool with_condexpr = true) {
    auto item = [&] { return with_condexpr ? expression() : or_expr(); };
    ExprPtr first = item();
    if (!is_op(",")) return first;
    ExprPtr t = node(Expr::Kind::list);
    t->op = "tuple";
    t->items.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (at_end() || is_op(")") || is_name("if")) break;
      t->items.push_back(item());
    }
    return t;
  }

 private:
  std::string describe() const {
    const Tok& t = toks_[pos_];
    switch (t.t) {
      case Tok::T::end: return "the end of the tag";
      case Tok::T::str: return "a string";
      case Tok::T::integer:
      case Tok::T::floating: return "a number";
      default: return "'" + t.s + "'";
    }
  }
  ExprPtr node(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    ExprPtr e = node(Expr::Kind::binary);
    e->op = op;
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  // Nesting is bounded so that a hostile template fails with an error instead of exhausting the stack.
  struct Nest {
    int& depth;
    Nest(int& d, const std::string& where) : depth(d) {
      DF_CHECK(++depth <= kMaxNesting, "%s: expressions nested deeper than %d", where.c_str(), kMaxNesting);
    }
    ~Nest() { --depth; }
  };

  ExprPtr condexpr() {
    Nest nest(depth_, where_);
    ExprPtr e = or_expr();
    while (is_name("if")) {
      ++pos_;
      ExprPtr t = node(Expr::Kind::ternary);
      t->items.push_back(std::move(e));
      t->items.push_back(or_expr());
      if (is_name("else")) {
        ++pos_;
        t->items.push_back(condexpr());
      } else {
        t->items.push_back(nullptr);
      }
      e = std::move(t);
    }
    return e;
  }
  // One left-associative level: operands from `next` joined by any of `ops` (operator tokens, or the words
  // "and" / "or").
  ExprPtr left_assoc(ExprPtr (ExprParser::*next)(), std::initializer_list<const char*> ops) {
    ExprPtr e = (this->*next)();
    for (;;) {
      const char* hit = nullptr;
      for (const char* o : ops)
        if (is_op(o) || is_name(o)) hit = o;
      if (!hit) return e;
      ++pos_;
      e = binary(hit, std::move(e), (this->*next)());
    }
  }
  ExprPtr or_expr() { return left_assoc(&ExprParser::and_expr, {"or"}); }
  ExprPtr and_expr() { return left_assoc(&ExprParser::not_expr, {"and"}); }
  ExprPtr not_expr() {
    if (is_name("not")) {
      ++pos_;
      ExprPtr e = node(Expr::Kind::unary);
      e->op = "not";
      e->items.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    for (;;) {
      std::string op;
      if (is_comparison()) {
        op = toks_[pos_].s;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else {
        return e;
      }
      e = binary(op, std::move(e), math1());
      DF_CHECK(!is_comparison(), "%s: chained comparisons (a < b < c) are not supported", where_.c_str());
    }
  }
  ExprPtr math1() { return left_assoc(&ExprParser::concat, {"+", "-"}); }
  ExprPtr concat() { return left_assoc(&ExprParser::math2, {"~"}); }
  ExprPtr math2() { return left_assoc(&ExprParser::power, {"*", "/", "//", "%"}); }
  ExprPtr power() { return left_assoc(&ExprParser::unary_filtered, {"**"}); }
  ExprPtr unary_filtered() { return unary(true); }
  ExprPtr unary(bool with_filter) {
    Nest nest(depth_, where_);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(Expr::Kind::unary);
      e->op = toks_[pos_++].s;
      e->items.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }
  ExprPtr primary() {
    const Tok& t = toks_[pos_];
    ExprPtr e = node(Expr::Kind::literal);
    if (t.t == Tok::T::name) {
      ++pos_;
      if (t.s == "true" || t.s == "True") e->value = Value::boolean(true);
      else if (t.s == "false" || t.s == "False") e->value = Value::boolean(false);
      else if (t.s == "none" || t.s == "None") e->value = Value::none_value();
      else {
        e->kind = Expr::Kind::name;
        e->name = t.s;
      }
      return e;
    }
    if (t.t == Tok::T::str) {
      std::string s;
      while (toks_[pos_].t == Tok::T::str) s += toks_[pos_++].s;  // adjacent literals concatenate
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.t == Tok::T::integer) {
      ++pos_;
      e->value = Value::integer(t.i);
      return e;
    }
    if (t.t == Tok::T::floating) {
      ++pos_;
      e->value = Value::floating(t.f);
      return e;
    }
    if (is_op("(")) {
      ++pos_;
      if (is_op(")")) {
        ++pos_;
        e->kind = Expr::Kind::list;
        e->op = "tuple";
        return e;
      }
      ExprPtr inner = expression();
      if (is_op(",")) {
        ExprPtr tup = node(Expr::Kind::list);
        tup->op = "tuple";
        tup->items.push_back(std::move(inner));
        while (is_op(",")) {
          ++pos_;
          if (is_op(")")) break;
          tup->items.push_back(expression());
        }
        inner = std::move(tup);
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      ++pos_;
      e->kind = Expr::Kind::list;
      while (!is_op("]")) {
        e->items.push_back(expression());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      ++pos_;
      e->kind = Expr::Kind::dict;
      while (!is_op("}")) {
        ExprPtr key = expression();
        DF_CHECK(key->kind == Expr::Kind::literal && key->value.is_string(),
                 "%s: only string literals are supported as dict keys", where_.c_str());
        e->keys.push_back(key->value.s);
        expect_op(":");
        e->items.push_back(expression());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("}");
      return e;
    }
    DF_FAIL("%s: expected an expression but found %s", where_.c_str(), describe().c_str());
  }
  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      DF_CHECK(!is_op("*") && !is_op("**"), "%s: *args / **kwargs in a call are not supported", where_.c_str());
      if (toks_[pos_].t == Tok::T::name && toks_[pos_ + 1].t == Tok::T::op && toks_[pos_ + 1].s == "=") {
        e.kwarg_names.push_back(toks_[pos_].s);
        pos_ += 2;
        e.items.push_back(expression());
      } else {
        DF_CHECK(e.kwarg_names.empty(), "%s: a positional argument follows a keyword argument", where_.c_str());
        e.items.push_back(expression());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }
  ExprPtr call_on(ExprPtr callee) {
    ExprPtr c = node(Expr::Kind::call);
    c->items.push_back(std::move(callee));
    call_args(*c);
    return c;
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++pos_;
        const Tok& t = toks_[pos_];
        ExprPtr a = node(t.t == Tok::T::integer ? Expr::Kind::index : Expr::Kind::attr);
        a->items.push_back(std::move(e));
        if (t.t == Tok::T::integer) {
          ExprPtr idx = node(Expr::Kind::literal);
          idx->value = Value::integer(t.i);
          a->items.push_back(std::move(idx));
          ++pos_;
        } else {
          a->name = name();
        }
        e = std::move(a);
      } else if (is_op("[")) {
        ++pos_;
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expression();
          if (k < 2 && is_op(":")) {
            ++pos_;
            is_slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        ExprPtr s = node(is_slice ? Expr::Kind::slice : Expr::Kind::index);
        s->items.push_back(std::move(e));
        DF_CHECK(is_slice || parts[0], "%s: empty subscript []", where_.c_str());
        s->items.push_back(std::move(parts[0]));
        if (is_slice) {
          s->items.push_back(std::move(parts[1]));
          s->items.push_back(std::move(parts[2]));
        }
        e = std::move(s);
      } else if (is_op("(")) {
        e = call_on(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        ExprPtr f = node(Expr::Kind::filter);
        f->name = name();
        DF_CHECK(jinja_filter_exists(f->name), "%s: the filter '%s' is not supported by this renderer",
                 where_.c_str(), f->name.c_str());
        f->items.push_back(std::move(e));
        if (is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        ExprPtr t = node(Expr::Kind::test);
        if (is_name("not")) {
          ++pos_;
          t->negate = true;
        }
        t->name = name();
        DF_CHECK(jinja_test_exists(t->name), "%s: the test '%s' is not supported by this renderer", where_.c_str(),
                 t->name.c_str());
        t->items.push_back(std::move(e));
        const Tok& n = toks_[pos_];
        if (is_op("(")) {
          call_args(*t);
          DF_CHECK(t->kwarg_names.empty(), "%s: keyword arguments to a test are not supported", where_.c_str());
        } else if ((n.t == Tok::T::name || n.t == Tok::T::str || n.t == Tok::T::integer || n.t == Tok::T::floating ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          DF_CHECK(!is_name("is"), "%s: tests cannot be chained with 'is'", where_.c_str());
          t->items.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call_on(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::string where_;
  int line_;
  std::vector<Tok> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

class Parser {
 public:
  Parser(std::vector<Chunk> chunks, const std::string& name) : chunks_(std::move(chunks)), name_(name) {}

  Body parse_all() {
    std::string end;
    Body b = body({}, &end);
    return b;
  }

 private:
  // Statements until one of `ends` (a block tag whose first word is in it); that word goes to *end_found.
  Body body(const std::set<std::string>& ends, std::string* end_found) {
    DF_CHECK(++depth_ <= kMaxNesting, "%s line %d: blocks nested deeper than %d", name_.c_str(),
             pos_ < chunks_.size() ? chunks_[pos_].line : 0, kMaxNesting);
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    Body out;
    while (pos_ < chunks_.size()) {
      const Chunk& c = chunks_[pos_];
      if (c.kind == Chunk::Kind::text) {
        auto s = stmt(Stmt::Kind::text, c.line);
        s->text = c.src;
        out.push_back(std::move(s));
        ++pos_;
        continue;
      }
      if (c.kind == Chunk::Kind::var) {
        ExprParser p(c.src, c.line, name_);
        auto s = stmt(Stmt::Kind::output, c.line);
        s->expr = p.expression();
        p.expect_end("the expression");
        out.push_back(std::move(s));
        ++pos_;
        continue;
      }
      ExprParser p(c.src, c.line, name_);
      const std::string word = p.name();
      if (ends.count(word)) {
        *end_found = word;
        return out;
      }
      ++pos_;
      out.push_back(statement(word, p, c.line));
    }
    DF_CHECK(ends.empty(), "%s: the template ends inside a block; expected one of: %s", name_.c_str(),
             join(ends).c_str());
    return out;
  }

  static std::string join(const std::set<std::string>& s) {
    std::string out;
    for (const auto& w : s) out += (out.empty() ? "{% " : ", {% ") + w + " %}";
    return out;
  }

  StmtPtr stmt(Stmt::Kind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  // Consumes the end tag that body() stopped at and checks it carries nothing more.
  void close_tag(const char* word) {
    ExprParser p(chunks_[pos_].src, chunks_[pos_].line, name_);
    p.name();
    p.expect_end(word);
    ++pos_;
  }

  StmtPtr statement(const std::string& word, ExprParser& p, int line) {
    const std::string at = name_ + " line " + std::to_string(line);
    if (word == "if") {
      auto s = stmt(Stmt::Kind::if_, line);
      s->conds.push_back(p.expression());
      p.expect_end("the condition");
      for (;;) {
        std::string end;
        s->branches.push_back(body({"elif", "else", "endif"}, &end));
        ExprParser q(chunks_[pos_].src, chunks_[pos_].line, name_);
        q.name();
        ++pos_;
        if (end == "endif") {
          q.expect_end("endif");
          return s;
        }
        if (end == "else") {
          q.expect_end("else");
          s->conds.push_back(nullptr);
          std::string fin;
          s->branches.push_back(body({"endif"}, &fin));
          close_tag("endif");
          return s;
        }
        s->conds.push_back(q.expression());
        q.expect_end("the condition");
      }
    }
    if (word == "for") {
      auto s = stmt(Stmt::Kind::for_, line);
      s->targets.push_back(p.name());
      while (p.is_op(",")) {
        p.skip();
        s->targets.push_back(p.name());
      }
      DF_CHECK(p.is_name("in"), "%s: expected 'in' in the for statement", at.c_str());
      p.skip();
      s->expr = p.tuple_or_expression(false);
      if (p.is_name("if")) {
        p.skip();
        s->filter = p.expression();
      }
      DF_CHECK(!p.is_name("recursive"), "%s: recursive for loops are not supported by this renderer", at.c_str());
      p.expect_end("the for statement");
      std::string end;
      s->branches.push_back(body({"else", "endfor"}, &end));
      if (end == "else") {
        close_tag("else");
        s->branches.push_back(body({"endfor"}, &end));
      } else {
        s->branches.emplace_back();
      }
      close_tag("endfor");
      return s;
    }
    if (word == "set") {
      auto s = stmt(Stmt::Kind::set, line);
      s->targets.push_back(p.name());
      if (p.is_op(".")) {
        p.skip();
        s->target_attr = p.name();
      }
      while (p.is_op(",")) {
        DF_CHECK(s->target_attr.empty(), "%s: cannot unpack into a namespace attribute", at.c_str());
        p.skip();
        s->targets.push_back(p.name());
      }
      if (p.at_end()) {
        DF_CHECK(s->targets.size() == 1 && s->target_attr.empty(), "%s: a block set takes one plain name", at.c_str());
        s->kind = Stmt::Kind::set_block;
        std::string end;
        s->branches.push_back(body({"endset"}, &end));
        close_tag("endset");
        return s;
      }
      p.expect_op("=");
      s->expr = p.tuple_or_expression();
      p.expect_end("the set statement");
      return s;
    }
    if (word == "macro") {
      auto s = stmt(Stmt::Kind::macro, line);
      s->macro = std::make_unique<MacroDef>();
      s->macro->name = p.name();
      p.expect_op("(");
      while (!p.is_op(")")) {
        s->macro->params.push_back(p.name());
        if (p.is_op("=")) {
          p.skip();
          s->macro->defaults.push_back(p.expression());
        } else {
          DF_CHECK(s->macro->defaults.empty(), "%s: a macro parameter without a default follows one with a default",
                   at.c_str());
        }
        if (!p.is_op(",")) break;
        p.skip();
      }
      p.expect_op(")");
      p.expect_end("the macro signature");
      std::string end;
      s->macro->body = body({"endmacro"}, &end);
      close_tag("endmacro");
      return s;
    }
    if (word == "break" || word == "continue") {
      p.expect_end(word.c_str());
      return stmt(word == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, line);
    }
    if (word == "generation") {  // transformers' {% generation %} marks assistant text; it renders its body
      p.expect_end("generation");
      auto s = stmt(Stmt::Kind::generation, line);
      std::string end;
      s->branches.push_back(body({"endgeneration"}, &end));
      close_tag("endgeneration");
      return s;
    }
    DF_FAIL("%s: the '{%% %s %%}' tag is not supported by this renderer (supported: if, for, set, macro, break, "
            "continue, generation)", at.c_str(), word.c_str());
  }

  std::vector<Chunk> chunks_;
  std::string name_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body jinja_parse(const std::string& source, const std::string& name) {
  return Parser(jinja_split_chunks(source, name), name).parse_all();
}

}  // namespace df::jinja
