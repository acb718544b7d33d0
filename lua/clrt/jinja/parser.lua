-- clrt.jinja.parser — tokens to a syntax tree, with @huggingface/jinja's grammar and operator
-- precedence (lowest first): ternary / `x if c` select, or, and, not, comparisons and
-- `in` / `not in`, + - ~, * / // %, **, `is` tests, | filters, unary + -, calls and members.
-- A `for x in xs if c` loop is a select expression on its iterable, as there.
-- Every node has the template line it starts on; a statement the engine does not know is an
-- error naming it and that line.
local fail = require("clrt.jinja.lexer").fail

local M = {}

-- How deep expressions and blocks may nest (parentheses, lists, `not`, unary signs, if/for
-- inside if/for, elif chains, a chain of binary operators): real templates nest a few levels;
-- a hostile one nested 100,000 deep would overflow the stack with an error naming nothing.
M.MAX_NESTING = 200

function M.parse(toks)
  local cur = 1
  local any
  local depth = 0
  local function enter(at)
    depth = depth + 1
    if depth > M.MAX_NESTING then
      fail(at, ("expressions or blocks nested deeper than %d"):format(M.MAX_NESTING))
    end
  end
  local function leave(...) depth = depth - 1; return ... end
  local function tok(k) return toks[cur + (k or 0)] end
  local function line() local t = toks[cur] or toks[#toks]; return t and t.line or 1 end
  local function is(t, k) local x = toks[cur + (k or 0)]; return x ~= nil and x.t == t end
  local function is_name(v, k) local x = toks[cur + (k or 0)]; return x ~= nil and x.t == "name" and x.v == v end
  local function expect(t, what)
    local x = toks[cur]
    if not x or x.t ~= t then
      fail(x and x.line or line(), ("expected %s, found %s"):format(what, x and ("'" .. tostring(x.v) .. "'") or "the end of the template"))
    end
    cur = cur + 1
    return x
  end
  local function expect_name(v)
    if not is_name(v) then fail(line(), "expected '" .. v .. "'") end
    cur = cur + 1
  end
  local function is_statement(names)
    local a, b = toks[cur], toks[cur + 1]
    return a ~= nil and a.t == "{%" and b ~= nil and b.t == "name" and names[b.v] == true
  end
  local function until_statement(names, opener, at)
    enter(at)
    local body = {}
    while not is_statement(names) do
      if not toks[cur] then fail(at, ("'%s' is not closed (missing {%% end%s %%})"):format(opener, opener)) end
      body[#body + 1] = any()
    end
    return leave(body)
  end

  local expression, primary, args_list

  local function sequence(prim)
    local at = line()
    local fn = prim and primary or expression
    local first = fn()
    if not is(",") then return first end
    local items = { first }
    while is(",") do
      cur = cur + 1
      items[#items + 1] = fn()
      if not is(",") then break end
    end
    return { k = "Tuple", items = items, line = at }
  end

  function primary()
    local t = toks[cur]
    if not t then fail(line(), "unexpected end of the template") end
    cur = cur + 1
    if t.t == "num" then
      local v = tonumber(t.v)
      return { k = t.v:find(".", 1, true) and "Float" or "Int", v = v, line = t.line }
    elseif t.t == "str" then
      local v = t.v
      while is("str") do v = v .. toks[cur].v; cur = cur + 1 end
      return { k = "Str", v = v, line = t.line }
    elseif t.t == "name" then
      return { k = "Name", v = t.v, line = t.line }
    elseif t.t == "(" then
      local e = sequence(false)
      expect(")", "')'")
      return e
    elseif t.t == "[" then
      local items = {}
      while not is("]") do
        if not toks[cur] then fail(t.line, "a list [ is not closed") end
        items[#items + 1] = expression()
        if is(",") then cur = cur + 1 end
      end
      cur = cur + 1
      return { k = "Array", items = items, line = t.line }
    elseif t.t == "{" then
      local pairs_ = {}
      while not is("}") do
        if not toks[cur] then fail(t.line, "a dict { is not closed") end
        local key = expression()
        expect(":", "':' between a key and its value")
        pairs_[#pairs_ + 1] = { key, expression() }
        if is(",") then cur = cur + 1 end
      end
      cur = cur + 1
      return { k = "Object", pairs = pairs_, line = t.line }
    end
    fail(t.line, ("unexpected '%s'"):format(tostring(t.v)))
  end

  -- (a, b=c, *xs, **kw); mode "params" for macro and call-block parameters
  function args_list(mode)
    expect("(", "'('")
    local args, seen_kw, seen_spread, names = {}, false, false, {}
    while not is(")") do
      if not toks[cur] then fail(line(), "an argument list ( is not closed") end
      local at = line()
      local kwspread = is("pow")
      local spread = is("mul") and toks[cur].v == "*"
      if mode == "params" and (kwspread or spread) then fail(at, "argument unpacking is not allowed in parameters") end
      if kwspread then
        cur = cur + 1
        args[#args + 1] = { k = "KwSpread", arg = expression(), line = at }
        if is(",") then cur = cur + 1 end
        if not is(")") then fail(at, "** must be the last argument") end
        break
      end
      local a
      if spread then
        if seen_spread then fail(at, "only one * unpacking is allowed") end
        seen_spread = true
        cur = cur + 1
        a = { k = "Spread", arg = expression(), line = at }
      else
        a = expression()
        if is("=") then
          cur = cur + 1
          if a.k ~= "Name" then fail(at, "expected a name before '='") end
          a = { k = "Kw", key = a.v, value = expression(), line = at }
        end
        if mode == "params" then
          if a.k ~= "Name" and a.k ~= "Kw" then fail(at, "expected a parameter name") end
          local nm = a.k == "Name" and a.v or a.key
          if names[nm] then fail(at, "duplicate parameter " .. nm) end
          names[nm] = true
        end
        if a.k == "Kw" then seen_kw = true
        elseif seen_kw then fail(at, mode == "call" and "positional argument after a keyword argument" or "parameter without default after one with a default")
        elseif seen_spread then fail(at, "positional argument after * unpacking") end
      end
      args[#args + 1] = a
      if is(",") then cur = cur + 1 end
    end
    cur = cur + 1
    return args
  end

  local function member(obj)
    while is(".") or is("[") do
      local t = toks[cur]
      cur = cur + 1
      if t.t == "[" then
        local parts, slice = {}, false
        while not is("]") do
          if not toks[cur] then fail(t.line, "a [ is not closed") end
          if is(":") then
            parts[#parts + 1] = false; cur = cur + 1; slice = true
          else
            parts[#parts + 1] = expression()
            if is(":") then cur = cur + 1; slice = true end
          end
        end
        if #parts == 0 then fail(t.line, "empty []") end
        local prop
        if slice then
          if #parts > 3 then fail(t.line, "a slice takes at most 3 parts") end
          prop = { k = "Slice", start = parts[1] or nil, stop = parts[2] or nil, step = parts[3] or nil, line = t.line }
        else
          prop = parts[1]
        end
        expect("]", "']'")
        obj = { k = "Member", obj = obj, prop = prop, computed = true, line = t.line }
      else
        local p = primary()
        if p.k ~= "Name" and p.k ~= "Int" then fail(t.line, "expected a name or an integer after '.'") end
        obj = { k = "Member", obj = obj, prop = p, computed = false, line = t.line }
      end
    end
    return obj
  end

  local function call(callee)
    local e = { k = "Call", callee = callee, args = args_list("call"), line = callee.line }
    e = member(e)
    if is("(") then e = call(e) end
    return e
  end

  local function call_member()
    local m = member(primary())
    if is("(") then return call(m) end
    return m
  end

  local function unary_sign()
    local t = toks[cur]
    if t and (t.t == "unary" or t.t == "add") and (t.v == "-" or t.v == "+") then
      cur = cur + 1
      enter(t.line)
      return leave({ k = "Unary", op = t.v, arg = unary_sign(), line = t.line })
    end
    return call_member()
  end

  local function filtered()
    local e = unary_sign()
    while is("|") do
      local at = toks[cur].line
      cur = cur + 1
      local f = primary()
      if f.k ~= "Name" then fail(at, "expected a filter name after '|'") end
      if is("(") then f = call(f) end
      e = { k = "Filter", operand = e, filter = f, line = at }
    end
    return e
  end

  local function tested()
    local e = filtered()
    while is_name("is") do
      local at = toks[cur].line
      cur = cur + 1
      local negate = is_name("not")
      if negate then cur = cur + 1 end
      local t = primary()
      if t.k ~= "Name" then fail(at, "expected a test name after 'is'") end
      e = { k = "Test", operand = e, negate = negate, name = t.v, line = at }
    end
    return e
  end

  local function binary_chain(next_fn, match)
    return function()
      local left = next_fn()
      local chain = 0   -- each operator nests the tree one level deeper
      while true do
        local op = match()
        if not op then depth = depth - chain; return left end
        local at = toks[cur - 1].line
        enter(at)
        chain = chain + 1
        left = { k = "Bin", op = op, l = left, r = next_fn(), line = at }
      end
    end
  end

  local function tok_of(t) return function() if is(t) then cur = cur + 1; return toks[cur - 1].v end end end
  local power = binary_chain(tested, tok_of("pow"))
  local multiplicative = binary_chain(power, tok_of("mul"))
  local additive = binary_chain(multiplicative, tok_of("add"))
  local comparison = binary_chain(additive, function()
    if is_name("not") and is_name("in", 1) then cur = cur + 2; return "not in" end
    if is_name("in") then cur = cur + 1; return "in" end
    if is("cmp") then cur = cur + 1; return toks[cur - 1].v end
  end)
  local function negation()
    if is_name("not") then
      local at = toks[cur].line
      cur = cur + 1
      enter(at)
      return leave({ k = "Not", arg = negation(), line = at })
    end
    return comparison()
  end
  local logical_and = binary_chain(negation, function() if is_name("and") then cur = cur + 1; return "and" end end)
  local logical_or = binary_chain(logical_and, function() if is_name("or") then cur = cur + 1; return "or" end end)

  local function expression_body()
    local a = logical_or()
    if is_name("if") then
      local at = toks[cur].line
      cur = cur + 1
      local test = logical_or()
      if is_name("else") then
        cur = cur + 1
        return { k = "Ternary", cond = test, t = a, f = expression(), line = at }
      end
      return { k = "Select", lhs = a, test = test, line = at }
    end
    return a
  end
  function expression()
    enter(line())
    return leave(expression_body())
  end

  local END = {}
  local function names(...) local s = {}; for _, n in ipairs({ ... }) do s[n] = true end; return s end
  END.if_ = names("elif", "else", "endif")
  END.endif = names("endif")
  END.for_ = names("endfor", "else")
  END.endfor = names("endfor")

  local if_rest_body
  local function if_rest(at)
    enter(at)   -- an elif chain nests one level per elif
    return leave(if_rest_body(at))
  end
  function if_rest_body(at)
    local test = expression()
    expect("%}", "'%}'")
    local body = until_statement(END.if_, "if", at)
    local alt = {}
    if is_statement(names("elif")) then
      local eat = toks[cur].line
      cur = cur + 2
      alt[1] = if_rest(eat)
    elseif is_statement(names("else")) then
      cur = cur + 2
      expect("%}", "'%}'")
      alt = until_statement(END.endif, "if", at)
    end
    return { k = "If", test = test, body = body, alt = alt, line = at }
  end

  local function close_block(word)
    expect("{%", "'{%'")
    expect_name(word)
    expect("%}", "'%}'")
  end

  local function statement()
    local open = expect("{%", "'{%'")
    local t = toks[cur]
    if not t or t.t ~= "name" then fail(open.line, "expected a statement name after {%") end
    local name, at = t.v, t.line
    cur = cur + 1
    if name == "set" then
      local target = sequence(false)
      local value, body
      if is("=") then
        cur = cur + 1
        value = sequence(false)
      else
        expect("%}", "'%}'")
        body = until_statement(names("endset"), "set", at)
        expect("{%", "'{%'")
        expect_name("endset")
      end
      expect("%}", "'%}'")
      return { k = "Set", target = target, value = value, body = body, line = at }
    elseif name == "if" then
      local node = if_rest(at)
      close_block("endif")
      return node
    elseif name == "for" then
      local var = sequence(true)
      if var.k ~= "Name" and var.k ~= "Tuple" then fail(at, "expected a loop variable after 'for'") end
      if not is_name("in") then fail(at, "expected 'in' after the loop variable") end
      cur = cur + 1
      local iter = expression()
      expect("%}", "'%}'")
      local body = until_statement(END.for_, "for", at)
      local alt = {}
      if is_statement(names("else")) then
        cur = cur + 2
        expect("%}", "'%}'")
        alt = until_statement(END.endfor, "for", at)
      end
      close_block("endfor")
      return { k = "For", var = var, iter = iter, body = body, alt = alt, line = at }
    elseif name == "macro" then
      local nm = primary()
      if nm.k ~= "Name" then fail(at, "expected a macro name") end
      local params = args_list("params")
      expect("%}", "'%}'")
      local body = until_statement(names("endmacro"), "macro", at)
      close_block("endmacro")
      return { k = "Macro", name = nm.v, params = params, body = body, line = at }
    elseif name == "call" then
      local params = {}
      if is("(") then params = args_list("params") end
      local callee = primary()
      if callee.k ~= "Name" then fail(at, "expected a macro name after 'call'") end
      local args = args_list("call")
      expect("%}", "'%}'")
      local body = until_statement(names("endcall"), "call", at)
      close_block("endcall")
      return { k = "CallBlock", callee = callee, args = args, params = params, body = body, line = at }
    elseif name == "filter" then
      local f = primary()
      if f.k == "Name" and is("(") then f = call(f) end
      expect("%}", "'%}'")
      local body = until_statement(names("endfilter"), "filter", at)
      close_block("endfilter")
      return { k = "FilterBlock", filter = f, body = body, line = at }
    elseif name == "break" or name == "continue" then
      expect("%}", "'%}'")
      return { k = name == "break" and "Break" or "Continue", line = at }
    end
    fail(at, ("the statement {%% %s %%} is not supported"):format(name))
  end

  function any()
    local t = toks[cur]
    if t.t == "comment" then cur = cur + 1; return { k = "Comment", line = t.line } end
    if t.t == "text" then cur = cur + 1; return { k = "Str", v = t.v, line = t.line } end
    if t.t == "{%" then return statement() end
    if t.t == "{{" then
      cur = cur + 1
      local e = expression()
      expect("}}", "'}}'")
      return e
    end
    fail(t.line, ("unexpected '%s'"):format(tostring(t.v)))
  end

  local body = {}
  while cur <= #toks do body[#body + 1] = any() end
  return { k = "Program", body = body, line = 1 }
end

return M
