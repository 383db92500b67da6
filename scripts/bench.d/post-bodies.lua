-- wrk script: POST pre-signed notifications, each line once, threads taking disjoint lines.
-- Environment: BODIES=<file of POST bodies>, THREADS=<wrk -t value>. A run must not outlast its
-- file (lines would be reused and answer "duplicate"): scripts/bench sizes the files.
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end

function init(args)
  local nthreads = tonumber(os.getenv("THREADS") or "1")
  bodies = {}
  local i = 0
  for line in io.lines(os.getenv("BODIES")) do
    if i % nthreads == id then table.insert(bodies, line) end
    i = i + 1
  end
  index = 0
  headers = { ["Content-Type"] = "application/json" }
end

function request()
  index = index + 1
  if index > #bodies then index = 1 end
  return wrk.format("POST", "/apple/notifications", headers, bodies[index])
end
