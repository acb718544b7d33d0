-- clrt.plot — self-contained SVG line charts (no scripts, no external fonts or files), so
-- a run's curves open in any browser.
--   plot.panels({{name = "reward", x = {...}, y = {...}}, ...}, {title =, columns = 2})
--   plot.nice_ticks(lo, hi, n)  -> tick values covering [lo, hi] at 1/2/5 x 10^k steps
--   plot.bars({{name = "accuracy", labels = {...}, values = {...}, errors = {...}, range = {0, 1}}, ...}, opts)
--     -> one panel per metric of horizontal bars (one per label) with +-error whiskers; the
--        axis covers range (optional) and every value +- error
-- One panel per series (small multiples: metrics have different scales); a noisy series
-- (more than 20 points) is drawn faint with an exponential moving average on top, unless
-- the series says smooth = false (a schedule, such as lr, is not noise).
local M = {}

local palette = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2" }

local function esc(s)
  return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"):gsub('"', "&quot;"))
end

function M.nice_ticks(lo, hi, n)
  n = n or 5
  if hi < lo then lo, hi = hi, lo end
  -- values a rounding unit apart are one value: a step that small would not move v below
  -- (v + step == v), and the loop would never end
  if hi - lo <= math.max(math.abs(lo), math.abs(hi)) * 1e-9 then
    hi = lo
  end
  if hi == lo then
    local d = (lo == 0) and 1 or math.abs(lo) * 0.1
    lo, hi = lo - d, hi + d
  end
  local raw = (hi - lo) / math.max(1, n - 1)
  local mag = 10 ^ math.floor(math.log10(raw))
  local step
  for _, m in ipairs({ 1, 2, 2.5, 5, 10 }) do
    step = m * mag
    if step >= raw then break end
  end
  local first = math.floor(lo / step + 1e-9) * step
  local last = math.ceil(hi / step - 1e-9) * step
  local ticks = {}
  local v = first
  while v <= last + step * 1e-6 and #ticks < 100 do
    ticks[#ticks + 1] = (math.abs(v) < step * 1e-9) and 0 or v
    v = v + step
  end
  return ticks, step
end

local function label(v, step)
  if v == 0 then return "0" end
  local a = math.abs(v)
  if a >= 1e5 or a < 1e-3 then return ("%.1e"):format(v) end
  -- enough decimals to write the tick step exactly (0.25 needs 2, 0.5 needs 1)
  local decimals = 0
  while decimals < 10 do
    local scaled = step * 10 ^ decimals
    if math.abs(scaled - math.floor(scaled + 0.5)) < 1e-6 * math.max(1, scaled) then break end
    decimals = decimals + 1
  end
  return (("%." .. decimals .. "f"):format(v))
end

local function sig(v)
  local a = math.abs(v)
  if v == math.floor(v) and a < 1e6 then return ("%d"):format(v) end
  if a ~= 0 and (a < 1e-3 or a >= 1e5) then return ("%.3e"):format(v) end
  return ("%.4g"):format(v)
end

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

local function panel(out, s, px, py, w, h, color)
  local ml, mr, mt, mb = 58, 14, 28, 34
  local pw, ph = w - ml - mr, h - mt - mb
  out[#out + 1] = ('<g transform="translate(%d,%d)">'):format(px, py)
  out[#out + 1] = ('<rect x="0.5" y="0.5" width="%d" height="%d" fill="#ffffff" stroke="#dddddd"/>'):format(w - 1, h - 1)
  local xs, ys = {}, {}
  for i = 1, #s.y do
    if finite(s.x[i]) and finite(s.y[i]) then xs[#xs + 1] = s.x[i]; ys[#ys + 1] = s.y[i] end
  end
  local lastv = ys[#ys]
  out[#out + 1] = ('<text x="%d" y="18" font-size="13" font-weight="bold" fill="#222">%s%s</text>'):format(
    ml, esc(s.name), lastv and (' <tspan font-weight="normal" fill="#666">last ' .. esc(sig(lastv)) .. "</tspan>") or "")
  if #ys == 0 then
    out[#out + 1] = ('<text x="%d" y="%d" font-size="12" fill="#999">no data</text>'):format(ml + pw / 2 - 25, mt + ph / 2)
    out[#out + 1] = "</g>"
    return
  end
  local xlo, xhi, ylo, yhi = math.huge, -math.huge, math.huge, -math.huge
  for i = 1, #xs do
    xlo, xhi = math.min(xlo, xs[i]), math.max(xhi, xs[i])
    ylo, yhi = math.min(ylo, ys[i]), math.max(yhi, ys[i])
  end
  local yt, ystep = M.nice_ticks(ylo, yhi, 5)
  local xt, xstep = M.nice_ticks(xlo, xhi, 6)
  if xstep < 1 and xlo == math.floor(xlo) and xhi == math.floor(xhi) then
    -- steps are whole: a short run's axis ticks each step, never 1.5
    xt, xstep = {}, 1
    for v = xlo, math.max(xhi, xlo + 1) do xt[#xt + 1] = v end
  end
  ylo, yhi = yt[1], yt[#yt]
  xlo, xhi = xt[1], xt[#xt]
  local function X(v) return ml + (v - xlo) / (xhi - xlo) * pw end
  local function Y(v) return mt + ph - (v - ylo) / (yhi - ylo) * ph end
  for _, t in ipairs(yt) do
    out[#out + 1] = ('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eeeeee"/>'):format(ml, ml + pw, Y(t), Y(t))
    out[#out + 1] = ('<text x="%d" y="%.1f" font-size="10" fill="#555" text-anchor="end">%s</text>'):format(ml - 5, Y(t) + 3.5, esc(label(t, ystep)))
  end
  for _, t in ipairs(xt) do
    out[#out + 1] = ('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#f3f3f3"/>'):format(X(t), X(t), mt, mt + ph)
    out[#out + 1] = ('<text x="%.1f" y="%d" font-size="10" fill="#555" text-anchor="middle">%s</text>'):format(X(t), mt + ph + 14, esc(label(t, xstep)))
  end
  out[#out + 1] = ('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>'):format(ml, mt, pw, ph)
  out[#out + 1] = ('<text x="%d" y="%d" font-size="10" fill="#777" text-anchor="middle">step</text>'):format(ml + pw / 2, h - 6)
  local function polyline(vals, stroke, width, opacity)
    local pts = {}
    for i = 1, #xs do pts[i] = ("%.1f,%.1f"):format(X(xs[i]), Y(vals[i])) end
    out[#out + 1] = ('<polyline fill="none" stroke="%s" stroke-width="%s" stroke-opacity="%s" stroke-linejoin="round" points="%s"/>'):format(
      stroke, width, opacity, table.concat(pts, " "))
  end
  if #xs == 1 then
    out[#out + 1] = ('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>'):format(X(xs[1]), Y(ys[1]), color)
  elseif #xs > 20 and s.smooth ~= false then
    polyline(ys, color, 1, 0.3)
    local ema, e = {}, ys[1]
    local alpha = 2 / (math.min(50, math.floor(#xs / 10) + 2) + 1)
    for i = 1, #ys do e = alpha * ys[i] + (1 - alpha) * e; ema[i] = e end
    polyline(ema, color, 2, 1)
  else
    polyline(ys, color, 2, 1)
    for i = 1, #xs do
      out[#out + 1] = ('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>'):format(X(xs[i]), Y(ys[i]), color)
    end
  end
  out[#out + 1] = "</g>"
end

-- A page of panels in a grid: draw(out, item, i, x, y, w, h) draws item i at (x, y).
local function grid(items, opts, w, h, draw)
  local cols = opts.columns or (#items > 1 and 2 or 1)
  local top = opts.title and 34 or 0
  local rows = math.max(1, math.ceil(#items / cols))
  local W, H = cols * w + 10, rows * h + top + 10
  local out = {
    ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">'):format(W, H, W, H),
    ('<rect width="%d" height="%d" fill="#fafafa"/>'):format(W, H),
  }
  if opts.title then
    out[#out + 1] = ('<text x="10" y="24" font-size="16" font-weight="bold" fill="#111">%s</text>'):format(esc(opts.title))
  end
  for i, s in ipairs(items) do
    local c = (i - 1) % cols
    local r = math.floor((i - 1) / cols)
    draw(out, s, i, 5 + c * w, top + 5 + r * h, w - 5, h - 5)
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

function M.panels(series, opts)
  opts = opts or {}
  return grid(series, opts, opts.panel_width or 440, opts.panel_height or 240, function(out, s, i, x, y, w, h)
    panel(out, s, x, y, w, h, palette[(i - 1) % #palette + 1])
  end)
end

-- One panel of horizontal bars: labels down the left, value +- error as a bar and whisker.
local function bar_panel(out, s, px, py, w, h, colors)
  local ml, mr, mt, mb = 170, 16, 28, 24
  local pw, ph = w - ml - mr, h - mt - mb
  out[#out + 1] = ('<g transform="translate(%d,%d)">'):format(px, py)
  out[#out + 1] = ('<rect x="0.5" y="0.5" width="%d" height="%d" fill="#ffffff" stroke="#dddddd"/>'):format(w - 1, h - 1)
  out[#out + 1] = ('<text x="8" y="18" font-size="13" font-weight="bold" fill="#222">%s</text>'):format(esc(s.name))
  local lo, hi = 0, 0
  for i = 1, #s.labels do
    local v, e = s.values[i], finite(s.errors and s.errors[i]) and s.errors[i] or 0
    if finite(v) then lo, hi = math.min(lo, v - e), math.max(hi, v + e) end
  end
  if s.range then lo, hi = math.min(lo, s.range[1]), math.max(hi, s.range[2]) end
  local ticks, step = M.nice_ticks(lo, hi, 5)
  lo, hi = ticks[1], ticks[#ticks]
  local function X(v) return ml + (v - lo) / (hi - lo) * pw end
  for _, t in ipairs(ticks) do
    out[#out + 1] = ('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eeeeee"/>'):format(X(t), X(t), mt, mt + ph)
    out[#out + 1] = ('<text x="%.1f" y="%d" font-size="10" fill="#555" text-anchor="middle">%s</text>'):format(X(t), mt + ph + 14, esc(label(t, step)))
  end
  local n = math.max(1, #s.labels)
  local bh = ph / n
  for i, name in ipairs(s.labels) do
    local y = mt + (i - 1) * bh
    local v, e = s.values[i], s.errors and s.errors[i]
    out[#out + 1] = ('<text x="%d" y="%.1f" font-size="10" fill="#333" text-anchor="end">%s</text>'):format(ml - 6, y + bh / 2 + 3.5, esc(name))
    if finite(v) then
      local x0, x1 = X(math.min(0, v)), X(math.max(0, v))
      out[#out + 1] = ('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'):format(x0, y + bh * 0.15, math.max(0.5, x1 - x0),
        bh * 0.7, colors[(i - 1) % #colors + 1])
      if finite(e) and e > 0 then
        out[#out + 1] = ('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#222" stroke-width="1.2"/>'):format(X(v - e), X(v + e),
          y + bh / 2, y + bh / 2)
      end
      out[#out + 1] = ('<text x="%.1f" y="%.1f" font-size="9" fill="#222">%s</text>'):format(math.min(X(v + (finite(e) and e or 0)) + 3, ml + pw - 24),
        y + bh / 2 + 3, esc(sig(math.floor(v * 1000 + 0.5) / 1000)))
    else
      out[#out + 1] = ('<text x="%d" y="%.1f" font-size="10" fill="#999">no data</text>'):format(ml + 4, y + bh / 2 + 3.5)
    end
  end
  out[#out + 1] = ('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#999"/>'):format(X(0), X(0), mt, mt + ph)
  out[#out + 1] = "</g>"
end

function M.bars(panels_, opts)
  opts = opts or {}
  local n = 1
  for _, s in ipairs(panels_) do n = math.max(n, #s.labels) end
  return grid(panels_, opts, opts.panel_width or 480, opts.panel_height or (60 + 20 * n), function(out, s, _, x, y, w, h)
    bar_panel(out, s, x, y, w, h, palette)
  end)
end

return M
