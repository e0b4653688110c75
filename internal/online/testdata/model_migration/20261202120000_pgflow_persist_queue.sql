-- pgflow_persist_queue (20261202120000): pgflow 0.16.0 -> queue persistence.
--
-- What changes (SPEC §4):
--   * the address of every task's message becomes durable pgflow state:
--     flows.queue_name and step_tasks.queue_name, unique (queue_name, message_id);
--   * flow slugs become unique case-insensitively;
--   * work is claimed through one queue-aware function, pgflow.claim_tasks;
--   * 0.16.0 workers are fenced out (ensure_flow_compiled(text, jsonb) and
--     start_tasks are dropped; a protocol marker appears);
--   * every function that writes tasks or archives/deletes messages uses the
--     task's own queue_name.
--
-- Naming rule: the queue of a flow is named exactly as its slug, for legacy and
-- new flows alike. pgmq lowercases the table names (q_<lower(name)>), so two
-- slugs that differ only in case would share one physical queue; the
-- unique (lower(flow_slug)) index below makes such case-only aliases impossible,
-- and this file refuses to run while any exist.
--
-- How to run: the whole file in one transaction. `pgflow-upgrade apply` does
-- that for you (advisory lock, table locks with retries, preflight, then this
-- file, then post-conditions). Run by hand (psql -1 -f, atlas, a Supabase
-- migration), the guards below make it refuse anything but the 0.16.0 shape.
-- It reads pgmq only through its public functions.

-- ---------------------------------------------------------------------------
-- 1. Guard: the 0.16.0 baseline shape, or refuse.
--    Catalog-only checks, so they cost nothing and need no locks.
-- ---------------------------------------------------------------------------
do $guard$
declare
  v_missing text;
begin
  if pg_catalog.to_regnamespace('pgflow') is null then
    raise exception 'pgflow_persist_queue: schema pgflow does not exist'
      using hint = 'This migration upgrades a pgflow 0.16.0 database; this one has no pgflow.';
  end if;

  select pg_catalog.string_agg(t, ', ') into v_missing
  from pg_catalog.unnest(array['flows', 'steps', 'deps', 'runs', 'step_states', 'step_tasks', 'workers']) t
  where pg_catalog.to_regclass('pgflow.' || t) is null;
  if v_missing is not null then
    raise exception 'pgflow_persist_queue: pgflow tables missing: %', v_missing
      using hint = 'This is not a pgflow 0.16.0 database.';
  end if;

  if pg_catalog.to_regclass('pgflow.schema_revisions') is not null
     or exists (select 1 from pg_catalog.pg_attribute a
                where a.attrelid = 'pgflow.flows'::regclass
                  and a.attname = 'queue_name' and not a.attisdropped) then
    raise exception 'pgflow_persist_queue: already applied (queue_name or pgflow.schema_revisions exists)'
      using hint = 'Run `pgflow-upgrade status`: a rerun on an upgraded database is a no-op, a partial state needs a look.';
  end if;

  -- step_tasks.queue_name may exist in one shape only: prepared by
  -- `pgflow-upgrade apply --online` (docs/online.md), which adds the column
  -- nullable, backfills it in small batches while the application runs,
  -- validates a check that every row holds its flow slug, and builds the
  -- unique address index concurrently. Part 5 then only has to flip the
  -- column to NOT NULL (proven from the validated check, no scan).
  if exists (select 1 from pg_catalog.pg_attribute a
             where a.attrelid = 'pgflow.step_tasks'::regclass
               and a.attname = 'queue_name' and not a.attisdropped)
     and not (
       exists (select 1 from pg_catalog.pg_attribute a
               where a.attrelid = 'pgflow.step_tasks'::regclass and a.attname = 'queue_name'
                 and not a.attisdropped and not a.attnotnull and a.atttypid = 'pg_catalog.text'::regtype)
       and exists (select 1 from pg_catalog.pg_constraint c
                   where c.conrelid = 'pgflow.step_tasks'::regclass
                     and c.conname = 'step_tasks_queue_name_online_check' and c.contype = 'c' and c.convalidated
                     and pg_catalog.pg_get_constraintdef(c.oid) = 'CHECK (((queue_name IS NOT NULL) AND (queue_name = flow_slug)))')
       and exists (select 1 from pg_catalog.pg_index i
                   where i.indexrelid = pg_catalog.to_regclass('pgflow.step_tasks_queue_name_message_id_key')
                     and i.indrelid = 'pgflow.step_tasks'::regclass and i.indisunique and i.indisvalid
                     and pg_catalog.pg_get_indexdef(i.indexrelid) like '%(queue_name, message_id) WHERE (message_id IS NOT NULL)')) then
    raise exception 'pgflow_persist_queue: pgflow.step_tasks.queue_name exists, but not in the shape an online upgrade prepares (nullable text, validated check step_tasks_queue_name_online_check, valid unique index step_tasks_queue_name_message_id_key)'
      using hint = 'An online upgrade is unfinished: run `pgflow-upgrade apply --online` again to finish it, or `pgflow-upgrade apply --rollback-online` to return to 0.16.0.';
  end if;

  if pg_catalog.to_regprocedure('pgflow.ensure_flow_compiled(text, jsonb)') is null
     or pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid)') is null then
    raise exception 'pgflow_persist_queue: the 0.16.0 functions ensure_flow_compiled(text, jsonb) and start_tasks(text, bigint[], uuid) are not both present'
      using hint = 'This migration starts from pgflow 0.16.0 exactly.';
  end if;

  -- The engine functions this file keeps and calls (the 0.16.0 model's).
  select pg_catalog.string_agg(f, ', ') into v_missing
  from pg_catalog.unnest(array[
    'pgflow.add_step(text, text, text[], integer, integer, integer, integer, text, jsonb, jsonb, text, text)',
    'pgflow.complete_task(uuid, text, integer, jsonb)', 'pgflow.maybe_complete_run(uuid)',
    'pgflow._cascade(uuid)', 'pgflow._fail_run(uuid, text, text)',
    'pgflow._skip_step(uuid, text, text, boolean)']) f
  where pg_catalog.to_regprocedure(f) is null;
  if v_missing is not null then
    raise exception 'pgflow_persist_queue: pgflow 0.16.0 functions missing: %', v_missing
      using hint = 'This migration starts from the pgflow 0.16.0 engine exactly.';
  end if;

  -- Only pgmq's public API is used, so that is all we ask for.
  select pg_catalog.string_agg(f, ', ') into v_missing
  from pg_catalog.unnest(array[
    'pgmq.list_queues()', 'pgmq.create(text)', 'pgmq.drop_queue(text)',
    'pgmq.send_batch(text, jsonb[], integer)',
    'pgmq.read(text, integer, integer, jsonb)',
    'pgmq.read_with_poll(text, integer, integer, integer, integer, jsonb)',
    'pgmq.archive(text, bigint)', 'pgmq.archive(text, bigint[])',
    'pgmq.delete(text, bigint[])', 'pgmq.set_vt(text, bigint, integer)']) f
  where pg_catalog.to_regprocedure(f) is null;
  if v_missing is not null then
    raise exception 'pgflow_persist_queue: pgmq functions missing: %', v_missing
      using hint = 'Install pgmq 1.5 (CREATE EXTENSION pgmq) before upgrading pgflow.';
  end if;
end
$guard$;

-- ---------------------------------------------------------------------------
-- 2. Locks, in the documented order (flows -> steps -> deps -> runs ->
--    step_states -> step_tasks -> workers). `apply` has taken exactly these
--    already, so here they are granted at once. Run by hand, they make the
--    checks below exact and stop writers for the rest of the transaction.
--    flows and step_tasks are altered, which needs ACCESS EXCLUSIVE anyway;
--    the others only need writes stopped (EXCLUSIVE), so readers keep going.
--    NOWAIT, retried with backoff while holding none of them: application
--    transactions take these tables in other orders too (complete_task holds
--    a run, then its insert into step_tasks checks the flows FK), so waiting
--    for one lock while holding another could deadlock, and a queued
--    ACCESS EXCLUSIVE request would stall all traffic behind it.
-- ---------------------------------------------------------------------------
do $locks$
begin
  for attempt in 1 .. 40 loop
    begin
      lock table pgflow.flows in access exclusive mode nowait;
      lock table pgflow.steps, pgflow.deps, pgflow.runs, pgflow.step_states in exclusive mode nowait;
      lock table pgflow.step_tasks in access exclusive mode nowait;
      lock table pgflow.workers in exclusive mode nowait;
      return;
    exception when lock_not_available then
      -- The failed sub-block releases what it had locked; back off, then retry.
      perform pg_catalog.pg_sleep(least(0.05 * attempt, 1.0) * (0.5 + pg_catalog.random()));
    end;
  end loop;
  raise exception 'pgflow_persist_queue: could not lock the pgflow tables (busy for about 30 s)'
    using errcode = 'lock_not_available',
          hint = 'Use `pgflow-upgrade apply` (bounded retries, reports who blocks), or run this in a quieter moment.';
end
$locks$;

-- ---------------------------------------------------------------------------
-- 3. Guard: data that the new constraints would reject, with a clear message
--    instead of a bare constraint error. Nothing has changed yet.
-- ---------------------------------------------------------------------------
do $guard$
declare
  v_bad text;
begin
  -- Case-only aliases would share one physical pgmq queue (see the naming rule).
  select pg_catalog.string_agg(x.slugs, '; ') into v_bad
  from (select pg_catalog.string_agg(f.flow_slug, ', ' order by f.flow_slug) as slugs
        from pgflow.flows f
        group by pg_catalog.lower(f.flow_slug)
        having pg_catalog.count(*) > 1) x;
  if v_bad is not null then
    raise exception 'pgflow_persist_queue: flow slugs that differ only in case: %', v_bad
      using hint = 'Delete or rename all but one slug of each group (pgflow-upgrade audit lists them), then rerun.';
  end if;

  -- Every flow's queue (named as its slug) must exist, or its tasks would
  -- point at nothing.
  select pg_catalog.string_agg(f.flow_slug, ', ' order by f.flow_slug) into v_bad
  from pgflow.flows f
  where f.flow_slug not in (select q.queue_name::text from pgmq.list_queues() q);
  if v_bad is not null then
    raise exception 'pgflow_persist_queue: flows without a pgmq queue: %', v_bad
      using hint = 'Create the queue (select pgmq.create(<slug>)) or delete the flow, then rerun.';
  end if;
end
$guard$;

-- ---------------------------------------------------------------------------
-- 4. flows.queue_name: added nullable, backfilled, then NOT NULL.
--    flows is small, so a plain UPDATE is fine here.
-- ---------------------------------------------------------------------------
alter table pgflow.flows add column queue_name text;
update pgflow.flows set queue_name = flow_slug;
alter table pgflow.flows alter column queue_name set not null;

-- Case-insensitive slug uniqueness (the naming rule) and one flow per queue.
create unique index flows_lower_flow_slug_key on pgflow.flows (pg_catalog.lower(flow_slug));
alter table pgflow.flows add constraint flows_queue_name_key unique (queue_name);

-- ---------------------------------------------------------------------------
-- 5. step_tasks.queue_name: added nullable, backfilled, then NOT NULL.
--    For legacy rows the queue is the flow slug. step_tasks can hold millions
--    of rows, and an UPDATE backfill writes a new version of every row (and
--    every index entry) while holding the table: ~5x slower than a rewrite.
--    So the backfill is one table rewrite: ALTER COLUMN .. TYPE text USING
--    flow_slug fills every row in a single pass, and SET NOT NULL in the same
--    ALTER is checked during that pass instead of by another scan.
--    Prepared online (guard 1 proved the shape): every row already holds its
--    flow slug, so only SET NOT NULL is left, which PostgreSQL 12+ proves
--    from the validated check without scanning; then the check and the
--    insert trigger of the online upgrade go (no trigger stays on step_tasks).
-- ---------------------------------------------------------------------------
do $step_tasks$
begin
  if exists (select 1 from pg_catalog.pg_attribute a
             where a.attrelid = 'pgflow.step_tasks'::regclass
               and a.attname = 'queue_name' and not a.attisdropped) then
    alter table pgflow.step_tasks alter column queue_name set not null;
    alter table pgflow.step_tasks drop constraint step_tasks_queue_name_online_check;
    drop trigger if exists pgflow_upgrade_queue_name on pgflow.step_tasks;
  else
    alter table pgflow.step_tasks add column queue_name text;
    alter table pgflow.step_tasks
      alter column queue_name type text using flow_slug,
      alter column queue_name set not null;
  end if;
end
$step_tasks$;

-- The durable address of a message. claim_tasks and every queue-aware function
-- find a task by it. Two tasks of one flow sharing a message id make the
-- build fail; that is the check (a GROUP BY over millions of rows first would
-- cost as much as the build), turned into a refusal that says what is wrong.
do $index$
declare
  v_detail text;
begin
  -- Prepared online, it exists already (built concurrently, valid: guard 1).
  create unique index if not exists step_tasks_queue_name_message_id_key
    on pgflow.step_tasks (queue_name, message_id)
    where message_id is not null;
exception when unique_violation then
  get stacked diagnostics v_detail = pg_exception_detail;
  raise exception 'pgflow_persist_queue: tasks sharing a message id within a flow (%)', v_detail
    using errcode = 'unique_violation',
          hint = 'Each message belongs to one task; fix or delete the duplicates (pgflow-upgrade audit lists them), then rerun.';
end
$index$;

-- ---------------------------------------------------------------------------
-- 6. Revision record and protocol marker.
-- ---------------------------------------------------------------------------
-- Which migrations this database has had, recorded by the migration itself so
-- it is right however the file was run.
create table pgflow.schema_revisions (
  version    text primary key,
  name       text not null,
  applied_at timestamptz not null default now()
);
insert into pgflow.schema_revisions (version, name) values ('20261202120000', 'pgflow_persist_queue');

-- Workers check this before anything else: 2 = queue-aware claim_tasks.
create function pgflow.queue_protocol_version()
returns integer
language sql
stable
set search_path = ''
as $$ select 2 $$;

-- ---------------------------------------------------------------------------
-- 7. The fence: a 0.16.0 worker's first call is ensure_flow_compiled(text, jsonb)
--    and its claim is start_tasks; with both gone it fails before it registers
--    (or, already running, on its next claim, and its messages become visible
--    again when their vt passes: nothing is lost).
-- ---------------------------------------------------------------------------
drop function pgflow.ensure_flow_compiled(text, jsonb);
drop function pgflow.start_tasks(text, bigint[], uuid);
-- The three-argument ensure_flow_compiled (no default) is created in part 9;
-- claim_tasks replaces start_tasks in part 8.

-- ---------------------------------------------------------------------------
-- 8. Claiming: pgflow.claim_tasks, the one claim path of the new protocol.
-- ---------------------------------------------------------------------------
create type pgflow.claim_result as (
  kind        text,    -- 'claimed' | 'fatal' (one call returns rows of one kind only)
  queue_name  text,
  message_id  bigint,
  flow_slug   text,
  run_id      uuid,
  step_slug   text,
  task_index  integer,
  attempt     integer, -- attempts_count after the claim
  input       jsonb,   -- the handler's input
  flow_input  jsonb,
  reason      text     -- fatal only: 'no_task' | 'wrong_route' | 'wrong_work'
);

-- Reads a batch from one queue and claims the tasks its messages address.
--
--   1. read through pgmq.read / pgmq.read_with_poll (nothing else touches pgmq
--      tables); the lease of a claimed task is the message's vt:
--      visibility_timeout seconds.
--   2. match every message to its task by the durable address
--      (queue_name, message_id), and check the body names that same task:
--      no task -> 'no_task'; another flow -> 'wrong_route'; another
--      run/step/index -> 'wrong_work'. Any fatal message: return only the
--      fatal rows, claim nothing, make the valid messages visible again; the
--      fatal ones stay invisible for visibility_timeout.
--   3. lock parents first: runs by run_id, step states by (run_id, step_index)
--      (FOR KEY SHARE: claiming changes neither, they only must not be
--      deleted under us; it is compatible with the FOR NO KEY UPDATE that
--      complete_task/fail_task take, so claims never wait for or skip a run
--      whose tasks are completing, and the guarded UPDATE below re-checks
--      their status), then tasks by
--      (run_id, step_index, task_index) FOR UPDATE. All SKIP LOCKED, because
--      we already hold the batch's message rows (read locked them): waiting
--      here while complete_task/fail_task hold a run and wait for one of
--      those messages would deadlock. A message whose rows are busy is
--      released (vt 0) and claimed by a later call.
--   4. under those locks: messages of terminal tasks (completed, failed,
--      permanently stalled, or of a finished run or step) are archived;
--      queued tasks, and started ones whose lease expired (their message was
--      visible again), are claimed by a guarded UPDATE .. RETURNING, and only
--      what it changed is returned.
create function pgflow.claim_tasks(
  queue_name text, worker_id uuid, batch_size integer, visibility_timeout integer,
  max_poll_seconds integer default 0, poll_interval_ms integer default 100)
returns setof pgflow.claim_result
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_msgs       pgmq.message_record[];
  v_batch      pgflow.claim_result[];  -- one per message: its task's identity, kind 'fatal' or null
  v_runs       uuid[];
  v_state_runs uuid[];
  v_state_steps text[];
  v_locked     bigint[];               -- messages whose run, step state and task we hold
  v_terminal   bigint[];
begin
  -- 1. Read (read_with_poll returns nothing when max_poll_seconds is 0).
  if max_poll_seconds > 0 then
    v_msgs := array(select m from pgmq.read_with_poll(claim_tasks.queue_name, visibility_timeout,
                                                      batch_size, max_poll_seconds, poll_interval_ms) m);
  else
    v_msgs := array(select m from pgmq.read(claim_tasks.queue_name, visibility_timeout, batch_size) m);
  end if;
  if cardinality(v_msgs) = 0 then
    return;
  end if;

  -- 2. Match by address; identity columns never change, so no locks yet.
  v_batch := array(
    select row(case when x.reason is not null then 'fatal' end, claim_tasks.queue_name, x.msg_id,
               x.flow_slug, x.run_id, x.step_slug, x.task_index, null, null, null, x.reason)::pgflow.claim_result
    from (select m.msg_id, t.flow_slug, t.run_id, t.step_slug, t.task_index,
                 case when t.run_id is null then 'no_task'
                      when m.message ->> 'flow_slug' is distinct from t.flow_slug then 'wrong_route'
                      when (m.message ->> 'run_id', m.message ->> 'step_slug', m.message ->> 'task_index')
                           is distinct from (t.run_id::text, t.step_slug, t.task_index::text) then 'wrong_work'
                 end as reason
          from unnest(v_msgs) m
          left join pgflow.step_tasks t on t.queue_name = claim_tasks.queue_name and t.message_id = m.msg_id) x
    order by x.msg_id);

  if exists (select 1 from unnest(v_batch) b where b.kind = 'fatal') then
    perform pgmq.set_vt(claim_tasks.queue_name, b.message_id, 0) from unnest(v_batch) b where b.kind is null;
    return query select * from unnest(v_batch) b where b.kind = 'fatal';
    return;
  end if;

  -- 3. Lock parents first, in the documented order, skipping busy rows.
  v_runs := array(
    select r.run_id from pgflow.runs r
    where r.run_id in (select b.run_id from unnest(v_batch) b)
    order by r.run_id
    for key share skip locked);

  select coalesce(array_agg(l.run_id), '{}'), coalesce(array_agg(l.step_slug), '{}')
  into v_state_runs, v_state_steps
  from (select ss.run_id, ss.step_slug
        from pgflow.step_states ss
        join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
        where (ss.run_id, ss.step_slug) in (select b.run_id, b.step_slug from unnest(v_batch) b
                                            where b.run_id = any(v_runs))
        order by ss.run_id, s.step_index
        for key share of ss skip locked) l;

  v_locked := array(
    select t.message_id
    from pgflow.step_tasks t
    join pgflow.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    where t.queue_name = claim_tasks.queue_name
      and t.message_id in (select b.message_id from unnest(v_batch) b)
      and (t.run_id, t.step_slug) in (select * from unnest(v_state_runs, v_state_steps))
    order by t.run_id, s.step_index, t.task_index
    for update of t skip locked);

  -- Busy messages go back to the queue now rather than after their vt.
  perform pgmq.set_vt(claim_tasks.queue_name, b.message_id, 0)
  from unnest(v_batch) b where b.message_id <> all(v_locked);

  -- 4a. Terminal tasks: their messages are done with; archive (idempotent).
  v_terminal := array(
    select t.message_id
    from pgflow.step_tasks t
    join pgflow.runs r on r.run_id = t.run_id
    join pgflow.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    where t.queue_name = claim_tasks.queue_name and t.message_id = any(v_locked)
      and (t.status in ('completed', 'failed') or t.permanently_stalled_at is not null
           or r.status <> 'started' or ss.status in ('completed', 'failed', 'skipped')));
  if cardinality(v_terminal) > 0 then
    perform pgmq.archive(claim_tasks.queue_name, v_terminal);
  end if;

  -- 4b. Claim: the UPDATE re-checks every condition; only its rows are returned.
  return query
  with claimed as (
    update pgflow.step_tasks t
    set status = 'started', attempts_count = t.attempts_count + 1,
        started_at = now(), last_worker_id = claim_tasks.worker_id
    from pgflow.runs r, pgflow.step_states ss
    where t.queue_name = claim_tasks.queue_name
      and t.message_id = any(v_locked) and t.message_id <> all(v_terminal)
      and t.status in ('queued', 'started') and t.permanently_stalled_at is null
      and r.run_id = t.run_id and r.status = 'started'
      and ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    returning t.*, r.input as flow_input
  )
  select 'claimed', c.queue_name, c.message_id, c.flow_slug, c.run_id, c.step_slug, c.task_index,
         c.attempts_count,
         -- The handler's input, as 0.16.0's start_tasks built it (a root
         -- single step gets the flow input itself).
         case
           when s.step_type = 'map' and s.deps_count = 0 then c.flow_input -> c.task_index
           when s.step_type = 'map' then
             (select p.output -> c.task_index from pgflow.deps d
              join pgflow.step_states p on p.run_id = c.run_id and p.step_slug = d.dep_slug
              where d.flow_slug = c.flow_slug and d.step_slug = c.step_slug limit 1)
           when s.deps_count = 0 then c.flow_input
           else
             (select coalesce(jsonb_object_agg(d.dep_slug, p.output), '{}'::jsonb) from pgflow.deps d
              join pgflow.step_states p on p.run_id = c.run_id and p.step_slug = d.dep_slug
              where d.flow_slug = c.flow_slug and d.step_slug = c.step_slug and p.status = 'completed')
         end,
         c.flow_input, null::text
  from claimed c
  join pgflow.steps s on s.flow_slug = c.flow_slug and s.step_slug = c.step_slug
  order by c.message_id;
end;
$$;

-- Gives a started task back: queued again without consuming an attempt, its
-- message visible now. Only the worker that holds it can; false otherwise.
-- Used by a worker that shuts down before it ran a claimed task.
create function pgflow.release_task(run_id uuid, step_slug text, task_index integer, worker_id uuid)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
  v_msg   bigint;
begin
  -- Parents first: run, step state, then the task (by the UPDATE).
  perform 1 from pgflow.runs r where r.run_id = release_task.run_id for share;
  perform 1 from pgflow.step_states ss
  where ss.run_id = release_task.run_id and ss.step_slug = release_task.step_slug
  for share;

  update pgflow.step_tasks t
  set status = 'queued', attempts_count = greatest(t.attempts_count - 1, 0)
  where t.run_id = release_task.run_id and t.step_slug = release_task.step_slug
    and t.task_index = release_task.task_index
    and t.status = 'started' and t.last_worker_id = release_task.worker_id
  returning t.queue_name, t.message_id into v_queue, v_msg;
  if not found then
    return false;
  end if;
  if v_msg is not null then
    perform pgmq.set_vt(v_queue, v_msg, 0);
  end if;
  return true;
end;
$$;
-- ---------------------------------------------------------------------------
-- 9. Queue-aware engine functions: same signatures as 0.16.0, but every
--    message is addressed by the task's own queue_name (new tasks get their
--    flow's queue_name). Functions that reach pgmq only through the helpers
--    below (_fail_run, _skip_step) are unchanged; complete_task is replaced
--    further down (its locks and its completion path).
-- ---------------------------------------------------------------------------

-- A new flow's queue is named as its slug (the naming rule); the queue is
-- created when pgmq does not list it yet.
create or replace function pgflow.create_flow(
  flow_slug text,
  max_attempts int default null,
  base_delay int default null,
  timeout int default null
)
returns pgflow.flows
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
begin
  -- Case-only aliases would share one physical queue: say so clearly.
  select f.* into v_flow from pgflow.flows f
  where lower(f.flow_slug) = lower(create_flow.flow_slug) and f.flow_slug <> create_flow.flow_slug;
  if found then
    raise exception 'flow "%" differs only in case from existing flow "%"', create_flow.flow_slug, v_flow.flow_slug
      using errcode = '23505', hint = 'Flow slugs are unique case-insensitively: their queues would collide.';
  end if;

  insert into pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_name)
  values (create_flow.flow_slug,
          coalesce(create_flow.max_attempts, 3),
          coalesce(create_flow.base_delay, 5),
          coalesce(create_flow.timeout, 60),
          create_flow.flow_slug)
  on conflict on constraint flows_pkey do nothing;

  select f.* into v_flow from pgflow.flows f where f.flow_slug = create_flow.flow_slug;
  if not exists (select 1 from pgmq.list_queues() q where q.queue_name = v_flow.queue_name) then
    perform pgmq.create(v_flow.queue_name);
  end if;
  return v_flow;
end;
$$;

-- Starts every created step with no dependency left and at least one task:
-- one message per task in the flow's queue, one task row per message, each
-- row recording that queue.
create or replace function pgflow.start_ready_steps(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
  v_step record;
begin
  select f.queue_name into v_queue
  from pgflow.runs r join pgflow.flows f on f.flow_slug = r.flow_slug
  where r.run_id = start_ready_steps.run_id and r.status = 'started';
  if not found then
    return;
  end if;

  for v_step in
    select ss.flow_slug, ss.step_slug, ss.initial_tasks, coalesce(s.opt_start_delay, 0) as start_delay
    from pgflow.step_states ss
    join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = start_ready_steps.run_id
      and ss.status = 'created'
      and ss.remaining_deps = 0
      and ss.initial_tasks > 0
    order by s.step_index
    for update of ss
  loop
    update pgflow.step_states ss
    set status = 'started', started_at = now(), remaining_tasks = v_step.initial_tasks
    where ss.run_id = start_ready_steps.run_id and ss.step_slug = v_step.step_slug;

    -- send_batch allocates ids in input order, so ascending ids pair with task indexes.
    insert into pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id, queue_name)
    select v_step.flow_slug, start_ready_steps.run_id, v_step.step_slug,
           (row_number() over (order by m.msg_id) - 1)::int, m.msg_id, v_queue
    from pgmq.send_batch(
           v_queue,
           array(select jsonb_build_object(
                          'flow_slug', v_step.flow_slug,
                          'run_id', start_ready_steps.run_id,
                          'step_slug', v_step.step_slug,
                          'task_index', i)
                 from generate_series(0, v_step.initial_tasks - 1) as i
                 order by i),
           v_step.start_delay::int) as m(msg_id);
  end loop;
end;
$$;

-- Archives the messages of the run's active (queued/started) tasks, or of one
-- step's; task statuses are unchanged. Callers hold the run's row lock.
create or replace function pgflow._archive_active_messages(p_run_id uuid, p_step_slug text default null)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue record;
begin
  for v_queue in
    select st.queue_name, array_agg(st.message_id order by st.message_id) as ids
    from pgflow.step_tasks st
    where st.run_id = p_run_id
      and (p_step_slug is null or st.step_slug = p_step_slug)
      and st.status in ('queued', 'started')
      and st.message_id is not null
    group by st.queue_name
    order by st.queue_name
  loop
    perform count(*) from pgmq.archive(v_queue.queue_name, v_queue.ids);
  end loop;
end;
$$;

create or replace function pgflow._archive_task_message(p_run_id uuid, p_step_slug text, p_task_index int)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
  v_msg_id bigint;
begin
  select st.queue_name, st.message_id into v_queue, v_msg_id
  from pgflow.step_tasks st
  where st.run_id = p_run_id and st.step_slug = p_step_slug and st.task_index = p_task_index;

  if v_msg_id is not null then
    perform pgmq.archive(v_queue, v_msg_id);
  end if;
end;
$$;

-- complete_task: the 0.16.0 body with three changes. Its parent locks are
-- FOR NO KEY UPDATE instead of FOR UPDATE: it never changes a key, and the
-- weaker lock does not conflict with claim_tasks' FOR KEY SHARE, so claims of
-- a run go on while its tasks complete instead of skipping the run and
-- re-reading the same messages. It archives the message by the address in
-- the row it just updated. And it looks for what comes next (cascade, ready
-- steps, the run's end) only when the step completed: completions of one run
-- queue on its run lock, and for the other tasks of a map step that search
-- finds nothing (BENCHMARKS.md, worker throughput). Replacing it also makes
-- every session compile it afresh against the new step_tasks row type.
create or replace function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_task pgflow.step_tasks;
  v_step pgflow.steps;
  v_step_output jsonb;
begin
  select r.* into v_run from pgflow.runs r where r.run_id = complete_task.run_id for no key update;
  if not found then
    return;
  end if;

  select ss.* into v_state from pgflow.step_states ss
  where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug
  for no key update;

  select st.* into v_task from pgflow.step_tasks st
  where st.run_id = complete_task.run_id and st.step_slug = complete_task.step_slug
    and st.task_index = complete_task.task_index
  for no key update;
  if not found then
    return;
  end if;

  -- A failed (or finished) run: no-op.
  if v_run.status <> 'started' then
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return;
  end if;

  -- Step no longer running (skipped, failed): only the message goes.
  -- Same for a late call on a task that already finished.
  if v_state.status <> 'started' or v_task.status in ('completed', 'failed') then
    perform pgflow._archive_task_message(complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return;
  end if;

  -- A queued task (requeued as stalled, or waiting for a retry) is not the
  -- caller's any more; its message must stay for the next claim.
  if v_task.status <> 'started' then
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return;
  end if;

  select s.* into v_step from pgflow.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = complete_task.step_slug;

  -- A single step feeding a map must return an array.
  if v_step.step_type = 'single'
     and jsonb_typeof(complete_task.output) is distinct from 'array'
     and exists (select 1 from pgflow.deps d
                 join pgflow.steps c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
                 where d.flow_slug = v_task.flow_slug and d.dep_slug = complete_task.step_slug
                   and c.step_type = 'map') then
    update pgflow.step_tasks st
    set status = 'failed', failed_at = now(),
        error_message = format('step %s feeds a map step and must return an array, got %s',
                               complete_task.step_slug, coalesce(jsonb_typeof(complete_task.output), 'null'))
    where st.run_id = complete_task.run_id and st.step_slug = complete_task.step_slug
      and st.task_index = complete_task.task_index
    returning st.* into v_task;
    perform pgflow._archive_task_message(complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    perform pgflow._fail_run(complete_task.run_id, complete_task.step_slug, v_task.error_message);
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return;
  end if;

  update pgflow.step_tasks st
  set status = 'completed', completed_at = now(), output = complete_task.output
  where st.run_id = complete_task.run_id and st.step_slug = complete_task.step_slug
    and st.task_index = complete_task.task_index
  returning st.* into v_task;

  update pgflow.step_states ss
  set remaining_tasks = ss.remaining_tasks - 1
  where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug
  returning ss.* into v_state;

  -- The message is done with: archive it by the task's own address.
  if v_task.message_id is not null then
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
  end if;

  -- Only a step that completes changes what comes next (ready steps, skip
  -- conditions, the run's end). For the other tasks of a map step the three
  -- calls below have nothing to do, and every completion of a run runs
  -- under its run lock, so they would only make the others wait.
  if v_state.remaining_tasks = 0 then
    if v_step.step_type = 'map' then
      select coalesce(jsonb_agg(st.output order by st.task_index), '[]'::jsonb) into v_step_output
      from pgflow.step_tasks st
      where st.run_id = complete_task.run_id and st.step_slug = complete_task.step_slug;
    else
      v_step_output := complete_task.output;
    end if;
    perform pgflow._complete_step(complete_task.run_id, complete_task.step_slug, v_step_output);
    perform pgflow._cascade(complete_task.run_id);
    perform pgflow.start_ready_steps(complete_task.run_id);
    perform pgflow.maybe_complete_run(complete_task.run_id);
  end if;

  return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (complete_task.run_id, complete_task.step_slug, complete_task.task_index);
end;
$$;

-- As in 0.16.0; the retry's delay is set on the message in the task's queue.
create or replace function pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_task pgflow.step_tasks;
  v_step pgflow.steps;
  v_flow pgflow.flows;
  v_max_attempts int;
  v_delay int;
begin
  -- Parents first: run, step state, task.
  select r.* into v_run from pgflow.runs r where r.run_id = fail_task.run_id for no key update;
  if not found then
    return;
  end if;

  select ss.* into v_state from pgflow.step_states ss
  where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug
  for no key update;

  select st.* into v_task from pgflow.step_tasks st
  where st.run_id = fail_task.run_id and st.step_slug = fail_task.step_slug
    and st.task_index = fail_task.task_index
  for no key update;
  if not found then
    return;
  end if;

  -- Failed run: the task fails too and its message is archived.
  if v_run.status = 'failed' then
    update pgflow.step_tasks st
    set status = 'failed', failed_at = now(), error_message = fail_task.error_message
    where st.run_id = fail_task.run_id and st.step_slug = fail_task.step_slug
      and st.task_index = fail_task.task_index and st.status in ('queued', 'started')
    returning st.* into v_task;
    perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return;
  end if;

  -- Completed run, step no longer running, or a finished task: archive only.
  if v_run.status <> 'started' or v_state.status <> 'started' or v_task.status in ('completed', 'failed') then
    perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return;
  end if;

  -- A queued task (requeued as stalled, or released) is not the caller's any more.
  if v_task.status <> 'started' then
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return;
  end if;

  select f.* into v_flow from pgflow.flows f where f.flow_slug = v_task.flow_slug;
  select s.* into v_step from pgflow.steps s
  where s.flow_slug = v_task.flow_slug and s.step_slug = fail_task.step_slug;
  v_max_attempts := coalesce(v_step.opt_max_attempts, v_flow.opt_max_attempts);

  -- attempts_count already includes the attempt that just failed.
  if v_task.attempts_count < v_max_attempts then
    v_delay := least(
      floor(coalesce(v_step.opt_base_delay, v_flow.opt_base_delay)::numeric * power(2::numeric, v_task.attempts_count)),
      2147483647)::int;

    update pgflow.step_tasks st
    set status = 'queued', error_message = fail_task.error_message
    where st.run_id = fail_task.run_id and st.step_slug = fail_task.step_slug
      and st.task_index = fail_task.task_index
    returning st.* into v_task;

    if v_task.message_id is not null then
      perform pgmq.set_vt(v_task.queue_name, v_task.message_id, v_delay);
    end if;
    return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return;
  end if;

  -- Exhausted.
  update pgflow.step_tasks st
  set status = 'failed', failed_at = now(), error_message = fail_task.error_message
  where st.run_id = fail_task.run_id and st.step_slug = fail_task.step_slug
    and st.task_index = fail_task.task_index
  returning st.* into v_task;
  perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);

  if v_step.when_exhausted = 'fail' then
    perform pgflow._fail_run(fail_task.run_id, fail_task.step_slug, fail_task.error_message);
  else
    perform pgflow._skip_step(fail_task.run_id, fail_task.step_slug, 'handler_failed',
                              v_step.when_exhausted = 'skip-cascade');
    perform pgflow._cascade(fail_task.run_id);
    perform pgflow.start_ready_steps(fail_task.run_id);
    perform pgflow.maybe_complete_run(fail_task.run_id);
  end if;

  return query select st.* from pgflow.step_tasks st where (st.run_id, st.step_slug, st.task_index) = (fail_task.run_id, fail_task.step_slug, fail_task.task_index);
end;
$$;

-- Same result as 0.16.0, through pgmq.set_vt one message at a time (pgmq
-- has no batch set_vt, and its tables are not ours to update). Ascending ids,
-- so two concurrent callers lock shared messages in the same order.
create or replace function pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
returns table (msg_id bigint, read_ct int, enqueued_at timestamptz, vt timestamptz, message jsonb, headers jsonb)
language plpgsql
volatile
set search_path = ''
as $$
declare
  v record;
begin
  if set_vt_batch.msg_ids is null or cardinality(set_vt_batch.msg_ids) = 0 then
    return;
  end if;
  if cardinality(set_vt_batch.msg_ids) <> coalesce(cardinality(set_vt_batch.vt_offsets), -1) then
    raise exception 'set_vt_batch: % msg_ids but % vt_offsets',
      cardinality(set_vt_batch.msg_ids), coalesce(cardinality(set_vt_batch.vt_offsets), 0)
      using errcode = '22023';
  end if;

  for v in
    select x.id, x.off from unnest(set_vt_batch.msg_ids, set_vt_batch.vt_offsets) as x(id, off) order by x.id
  loop
    return query select * from pgmq.set_vt(set_vt_batch.queue_name, v.id, v.off);
  end loop;
end;
$$;

-- Tasks started more than the flow's opt_timeout + 30 s ago (#621, kept) are
-- requeued (message visible now) up to 3 times, then marked permanently
-- stalled and their message archived, each in the task's own queue.
-- It changes task rows only and never waits for them (SKIP LOCKED, in
-- (run_id, step_index, task_index) order), so it takes no parent locks.
create or replace function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_handled jsonb;
  v_queue record;
begin
  with stalled as (
    select st.run_id, st.step_slug, st.task_index, st.requeued_count
    from pgflow.step_tasks st
    join pgflow.flows f on f.flow_slug = st.flow_slug
    join pgflow.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
    where st.status = 'started'
      and st.permanently_stalled_at is null
      and st.started_at < now() - make_interval(secs => f.opt_timeout + 30)
    order by st.run_id, s.step_index, st.task_index
    for update of st skip locked
  ),
  updated as (
    update pgflow.step_tasks st
    set status = case when x.requeued_count < 3 then 'queued' else st.status end,
        requeued_count = case when x.requeued_count < 3 then st.requeued_count + 1 else st.requeued_count end,
        last_requeued_at = case when x.requeued_count < 3 then now() else st.last_requeued_at end,
        permanently_stalled_at = case when x.requeued_count < 3 then null else now() end
    from stalled x
    where st.run_id = x.run_id and st.step_slug = x.step_slug and st.task_index = x.task_index
    returning st.queue_name, st.message_id, (x.requeued_count < 3) as requeue
  )
  select coalesce(jsonb_agg(jsonb_build_object(
           'queue_name', u.queue_name, 'message_id', u.message_id, 'requeue', u.requeue)), '[]'::jsonb)
    into v_handled
  from updated u;

  for v_queue in
    select t.queue_name,
           array_agg(t.message_id order by t.message_id) filter (where t.requeue) as requeue_ids,
           array_agg(t.message_id order by t.message_id) filter (where not t.requeue) as stalled_ids
    from jsonb_to_recordset(v_handled) as t(queue_name text, message_id bigint, requeue boolean)
    where t.message_id is not null
    group by t.queue_name
    order by t.queue_name
  loop
    if v_queue.requeue_ids is not null then
      perform count(*) from pgflow.set_vt_batch(
        v_queue.queue_name, v_queue.requeue_ids, array_fill(0, array[cardinality(v_queue.requeue_ids)]));
    end if;
    if v_queue.stalled_ids is not null then
      perform count(*) from pgmq.archive(v_queue.queue_name, v_queue.stalled_ids);
    end if;
  end loop;

  return jsonb_array_length(v_handled);
end;
$$;

-- Deletes finished runs older than the interval: their messages first, with
-- pgmq.delete in each task's own queue (only queues pgmq lists: a queue that
-- is gone has nothing left to delete), then their rows, parents locked first.
-- Also archive rows older than the interval and workers silent that long.
create or replace function pgflow.prune_data_older_than(retention_interval interval)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_cutoff timestamptz := now() - prune_data_older_than.retention_interval;
  v_run_ids uuid[];
  v_queue record;
begin
  v_run_ids := array(
    select r.run_id from pgflow.runs r
    where r.status in ('completed', 'failed')
      and coalesce(r.completed_at, r.failed_at) < v_cutoff
    order by r.run_id
    for update of r);

  for v_queue in
    select st.queue_name, array_agg(st.message_id order by st.message_id) as ids
    from pgflow.step_tasks st
    where st.run_id = any(v_run_ids)
      and st.message_id is not null
      and st.queue_name in (select q.queue_name::text from pgmq.list_queues() q)
    group by st.queue_name
    order by st.queue_name
  loop
    perform count(*) from pgmq.delete(v_queue.queue_name, v_queue.ids);
  end loop;

  delete from pgflow.step_tasks st where st.run_id = any(v_run_ids);
  delete from pgflow.step_states ss where ss.run_id = any(v_run_ids);
  delete from pgflow.runs r where r.run_id = any(v_run_ids);

  -- pgmq has no function that prunes an archive by age; this is the one
  -- place that touches a pgmq table, named by pgmq's own format_table_name.
  for v_queue in
    select f.queue_name from pgflow.flows f
    where f.queue_name in (select q.queue_name::text from pgmq.list_queues() q)
    order by f.queue_name
  loop
    execute format('delete from pgmq.%I where archived_at < $1', pgmq.format_table_name(v_queue.queue_name, 'a'))
      using v_cutoff;
  end loop;

  delete from pgflow.workers w where w.last_heartbeat_at < v_cutoff;
end;
$$;

-- Deletes a flow with all its rows and its queue. Parents are locked first
-- (the flow, then its runs by run_id), rows deleted children first (no FK
-- cascades), then the queue is dropped through pgmq (only when pgmq lists
-- it: pgmq 1.5.1 raises on a missing queue, 1.5.2 returns false) and checked
-- to be gone.
create or replace function pgflow.delete_flow_and_data(p_flow_slug text)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
begin
  select f.queue_name into v_queue from pgflow.flows f where f.flow_slug = p_flow_slug for update;
  if not found then
    v_queue := p_flow_slug; -- no flow row: clean up a queue left behind under the naming rule
  end if;
  perform 1 from pgflow.runs r where r.flow_slug = p_flow_slug order by r.run_id for update;

  delete from pgflow.step_tasks st where st.flow_slug = p_flow_slug;
  delete from pgflow.step_states ss where ss.flow_slug = p_flow_slug;
  delete from pgflow.runs r where r.flow_slug = p_flow_slug;
  delete from pgflow.deps d where d.flow_slug = p_flow_slug;
  delete from pgflow.steps s where s.flow_slug = p_flow_slug;
  delete from pgflow.flows f where f.flow_slug = p_flow_slug;

  if exists (select 1 from pgmq.list_queues() q where q.queue_name = v_queue) then
    perform pgmq.drop_queue(v_queue);
  end if;
  if exists (select 1 from pgmq.list_queues() q where q.queue_name = v_queue) then
    raise exception 'delete_flow_and_data: queue "%" is still listed by pgmq after drop_queue', v_queue
      using errcode = '55000';
  end if;
end;
$$;

-- ---------------------------------------------------------------------------
-- ensure_flow_compiled, three arguments and no default (see the fence).
-- Statuses: compiled (new flow), verified (same shape), recompiled (the flow
-- and all its data were deleted and rebuilt: only with allow_data_loss),
-- mismatch. Compared per step in index order: slug, stepType, dependencies
-- (as a set), whenUnmet, whenExhausted, requiredInputPattern,
-- forbiddenInputPattern; options are not compared.
-- ---------------------------------------------------------------------------

-- Builds a flow from a shape, through create_flow (so it gets its queue_name
-- and queue) and add_step.
create function pgflow._compile_flow(p_flow_slug text, p_shape jsonb)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step jsonb;
begin
  perform pgflow.create_flow(p_flow_slug,
    (p_shape #>> '{options,maxAttempts}')::int,
    (p_shape #>> '{options,baseDelay}')::int,
    (p_shape #>> '{options,timeout}')::int);

  for v_step in
    select e.value from jsonb_array_elements(coalesce(p_shape -> 'steps', '[]'::jsonb)) with ordinality e
    order by e.ordinality
  loop
    perform pgflow.add_step(
      flow_slug => p_flow_slug,
      step_slug => v_step ->> 'slug',
      deps_slugs => array(select jsonb_array_elements_text(coalesce(v_step -> 'dependencies', '[]'::jsonb))),
      max_attempts => (v_step #>> '{options,maxAttempts}')::int,
      base_delay => (v_step #>> '{options,baseDelay}')::int,
      timeout => (v_step #>> '{options,timeout}')::int,
      start_delay => (v_step #>> '{options,startDelay}')::int,
      step_type => coalesce(v_step ->> 'stepType', 'single'),
      required_input_pattern => case when (v_step #>> '{requiredInputPattern,defined}') = 'true'
                                     then v_step #> '{requiredInputPattern,value}' end,
      forbidden_input_pattern => case when (v_step #>> '{forbiddenInputPattern,defined}') = 'true'
                                      then v_step #> '{forbiddenInputPattern,value}' end,
      when_unmet => coalesce(v_step ->> 'whenUnmet', 'skip'),
      when_exhausted => coalesce(v_step ->> 'whenExhausted', 'fail'));
  end loop;
end;
$$;

-- How a flow in the database differs from a shape ({} when it does not).
create function pgflow._flow_shape_differences(p_flow_slug text, p_shape jsonb)
returns text[]
language plpgsql
stable
set search_path = ''
as $$
declare
  v_want jsonb;
  v_have jsonb;
  v_a jsonb;
  v_b jsonb;
  v_key text;
  v_diff text[] := '{}';
begin
  -- Both sides normalised the same way: defaults filled in, dependencies sorted.
  select coalesce(jsonb_agg(jsonb_build_object(
           'slug', e.value ->> 'slug',
           'stepType', coalesce(e.value ->> 'stepType', 'single'),
           'dependencies', (select coalesce(jsonb_agg(d.value order by d.value), '[]'::jsonb)
                            from jsonb_array_elements_text(coalesce(e.value -> 'dependencies', '[]'::jsonb)) d),
           'whenUnmet', coalesce(e.value ->> 'whenUnmet', 'skip'),
           'whenExhausted', coalesce(e.value ->> 'whenExhausted', 'fail'),
           'requiredInputPattern', case when (e.value #>> '{requiredInputPattern,defined}') = 'true'
                                        then e.value #> '{requiredInputPattern,value}' end,
           'forbiddenInputPattern', case when (e.value #>> '{forbiddenInputPattern,defined}') = 'true'
                                         then e.value #> '{forbiddenInputPattern,value}' end
         ) order by e.ordinality), '[]'::jsonb)
    into v_want
  from jsonb_array_elements(coalesce(p_shape -> 'steps', '[]'::jsonb)) with ordinality e;

  select coalesce(jsonb_agg(jsonb_build_object(
           'slug', s.step_slug,
           'stepType', s.step_type,
           'dependencies', (select coalesce(jsonb_agg(to_jsonb(d.dep_slug) order by d.dep_slug), '[]'::jsonb)
                            from pgflow.deps d
                            where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug),
           'whenUnmet', s.when_unmet,
           'whenExhausted', s.when_exhausted,
           'requiredInputPattern', s.required_input_pattern,
           'forbiddenInputPattern', s.forbidden_input_pattern
         ) order by s.step_index), '[]'::jsonb)
    into v_have
  from pgflow.steps s
  where s.flow_slug = p_flow_slug;

  if jsonb_array_length(v_want) <> jsonb_array_length(v_have) then
    v_diff := v_diff || format('Step count differs: %s vs %s', jsonb_array_length(v_want), jsonb_array_length(v_have));
  end if;
  for i in 0 .. greatest(jsonb_array_length(v_want), jsonb_array_length(v_have)) - 1 loop
    v_a := v_want -> i;
    v_b := v_have -> i;
    if v_a is null then
      v_diff := v_diff || format('Step at index %s: missing in shape (database has %s)', i, v_b ->> 'slug');
    elsif v_b is null then
      v_diff := v_diff || format('Step at index %s: missing in database (shape has %s)', i, v_a ->> 'slug');
    else
      foreach v_key in array array['slug', 'stepType', 'dependencies', 'whenUnmet', 'whenExhausted',
                                   'requiredInputPattern', 'forbiddenInputPattern'] loop
        if (v_a -> v_key) is distinct from (v_b -> v_key) then
          v_diff := v_diff || format('Step at index %s: %s differs %s vs %s', i, v_key,
            coalesce((v_a -> v_key)::text, 'undefined'), coalesce((v_b -> v_key)::text, 'undefined'));
        end if;
      end loop;
    end if;
  end loop;
  return v_diff;
end;
$$;

create function pgflow.ensure_flow_compiled(flow_slug text, shape jsonb, allow_data_loss boolean)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_diff text[];
begin
  if jsonb_typeof(ensure_flow_compiled.shape) is distinct from 'object'
     or jsonb_typeof(coalesce(ensure_flow_compiled.shape -> 'steps', '[]'::jsonb)) <> 'array' then
    raise exception 'ensure_flow_compiled: shape must be an object with a "steps" array'
      using errcode = '22023';
  end if;

  -- One compiler per flow at a time.
  perform pg_advisory_xact_lock(1, hashtext(ensure_flow_compiled.flow_slug));

  if not exists (select 1 from pgflow.flows f where f.flow_slug = ensure_flow_compiled.flow_slug) then
    perform pgflow._compile_flow(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
    return jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb);
  end if;

  v_diff := pgflow._flow_shape_differences(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
  if cardinality(v_diff) = 0 then
    return jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb);
  end if;
  if coalesce(ensure_flow_compiled.allow_data_loss, false) then
    perform pgflow.delete_flow_and_data(ensure_flow_compiled.flow_slug);
    perform pgflow._compile_flow(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape);
    return jsonb_build_object('status', 'recompiled', 'differences', to_jsonb(v_diff));
  end if;
  return jsonb_build_object('status', 'mismatch', 'differences', to_jsonb(v_diff));
end;
$$;

-- ---------------------------------------------------------------------------
-- 10. Deliberately absent: no trigger on step_tasks. Its rows are updated
--     several times per task (claim, complete, retry), the hot path; nothing
--     in pgflow changes queue_name after insert, and the unique address index
--     is what the queue-aware functions rely on.
-- ---------------------------------------------------------------------------
