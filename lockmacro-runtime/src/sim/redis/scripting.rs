//! The scripts run as Redis 7 runs them: Lua 5.1, `KEYS` and `ARGV` as globals, `redis.call`
//! and `redis.pcall` answered by the node's own commands, Redis's conversions between Lua
//! values and replies, and globals protected. A script runs whole before any other command,
//! on a clock that stands still while it runs.

use std::collections::BTreeMap;

use ::redis::Value as Reply;
use mlua::{Function, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table, Value};

use super::keyspace::Keyspace;
use super::reply::{self, Args};

/// The Lua side of `redis.call`: a command's reply as a value, an error as `{err = ...}`
/// raised by `call` and returned by `pcall` (as Redis 7 does, so a caught error keeps its code);
/// then the runner of a script, and the globals protected as Redis protects them.
const PRELUDE: &str = r#"
local command = ...
local redis = {}
function redis.pcall(...) return command(...) end
function redis.call(...)
  local reply = command(...)
  if type(reply) == 'table' and reply.err then error(reply) end
  return reply
end
function redis.error_reply(message) return {err = message} end
function redis.status_reply(message) return {ok = message} end
function redis.log() end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
rawset(_G, 'redis', redis)
setmetatable(_G, {
  __newindex = function(_, name)
    error("Script attempted to create global variable '" .. tostring(name) .. "'", 2)
  end,
  __index = function(_, name)
    error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
  end,
})
return function(script) return pcall(script) end
"#;

/// The node's Lua and the scripts it knows, by SHA1.
pub(crate) struct Scripting {
    lua: Lua,
    /// `pcall` of a script: whether it returned, and its result or error.
    runner: Function,
    scripts: BTreeMap<String, Function>,
}

impl Scripting {
    pub(crate) fn new() -> Self {
        // Redis's libraries, less those it leaves out (no `io`, `os`, `package`); its `cjson`,
        // `bit`, `struct` and `cmsgpack` are left out too: no script of ours uses them.
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )
        .expect("Lua's standard libraries load");
        let command = lua
            .create_function(command)
            .expect("a Rust function becomes a Lua one");
        let runner = lua
            .load(PRELUDE)
            .set_name("@prelude")
            .call::<Function>(command)
            .expect("the prelude runs");
        Self {
            lua,
            runner,
            scripts: BTreeMap::new(),
        }
    }

    /// Compiles `source` and keeps it: its SHA1, or the compile error's reply.
    pub(crate) fn load(&mut self, source: &[u8]) -> Result<String, Reply> {
        let text = std::str::from_utf8(source)
            .map_err(|_| reply::error("ERR script is not UTF-8 (the simulated Redis)"))?;
        let sha = ::redis::Script::new(text).get_hash().to_owned();
        if !self.scripts.contains_key(&sha) {
            let function = self
                .lua
                .load(source)
                .set_name("@user_script")
                .into_function()
                .map_err(|error| {
                    reply::error(&format!(
                        "ERR Error compiling script (new function): {error}"
                    ))
                })?;
            self.scripts.insert(sha.clone(), function);
        }
        Ok(sha)
    }

    pub(crate) fn exists(&self, sha: &str) -> bool {
        self.scripts.contains_key(&sha.to_ascii_lowercase())
    }

    /// Forgets every script (`SCRIPT FLUSH`, a restart).
    pub(crate) fn flush(&mut self) {
        self.scripts.clear();
    }

    /// Runs the script `sha` with `keys` and `argv` over `keyspace`, whole.
    pub(crate) fn run(
        &mut self,
        sha: &str,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
        keyspace: &mut Keyspace,
    ) -> Reply {
        let sha = sha.to_ascii_lowercase();
        let Some(script) = self.scripts.get(&sha) else {
            return reply::error("NOSCRIPT No matching script. Please use EVAL.");
        };
        let outcome = self.with_keyspace(keyspace, |lua, runner| {
            let globals = lua.globals();
            globals.raw_set(
                "KEYS",
                lua.create_sequence_from(keys.iter().map(bytes(lua)))?,
            )?;
            globals.raw_set(
                "ARGV",
                lua.create_sequence_from(argv.iter().map(bytes(lua)))?,
            )?;
            runner.call::<(bool, Value)>(script)
        });
        match outcome {
            Ok((true, value)) => to_reply(&value),
            Ok((false, error)) => reply::error(&format!("{} script: {sha}", failure(&error))),
            Err(error) => reply::error(&format!("ERR the simulated Redis's Lua: {error}")),
        }
    }

    /// `run` with `keyspace` lent to Lua, where `redis.call` finds it, for the script's length.
    fn with_keyspace<R>(
        &self,
        keyspace: &mut Keyspace,
        run: impl FnOnce(&Lua, &Function) -> mlua::Result<R>,
    ) -> mlua::Result<R> {
        self.lua.set_app_data(std::mem::take(keyspace));
        let outcome = run(&self.lua, &self.runner);
        *keyspace = self
            .lua
            .remove_app_data::<Keyspace>()
            .expect("the keyspace lent to the script");
        outcome
    }
}

/// `redis.call`'s and `redis.pcall`'s work: the command run on the keyspace lent to the script,
/// its reply as Lua sees it.
fn command(lua: &Lua, args: MultiValue) -> mlua::Result<Value> {
    let mut command = Vec::with_capacity(args.len());
    for arg in &args {
        command.push(match arg {
            Value::String(text) => text.as_bytes().to_vec(),
            Value::Integer(n) => n.to_string().into_bytes(),
            Value::Number(n) => number_text(*n).into_bytes(),
            _ => {
                let message = "ERR Lua redis lib command arguments must be strings or integers";
                return to_lua(lua, &reply::error(message));
            }
        });
    }
    if command.is_empty() {
        let message = "ERR Please specify at least one argument for this redis lib call";
        return to_lua(lua, &reply::error(message));
    }
    let args = Args::new(command);
    let reply = if matches!(
        args.name().as_str(),
        "EVAL" | "EVALSHA" | "SCRIPT" | "WAIT" | "SUBSCRIBE" | "SSUBSCRIBE"
    ) {
        reply::error("ERR This Redis command is not allowed from script")
    } else {
        let mut keyspace = lua
            .app_data_mut::<Keyspace>()
            .expect("a script runs with the keyspace lent");
        keyspace.execute(&args)
    };
    to_lua(lua, &reply)
}

/// A Lua number as an argument: whole numbers as integers (Redis 7.0 prints `%.17g`, 7.2 and
/// Valkey the shortest form: both give whole numbers without a fraction or exponent).
fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e17 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn bytes(lua: &Lua) -> impl Fn(&Vec<u8>) -> LuaString + '_ {
    |bytes| {
        lua.create_string(bytes)
            .expect("Lua makes a string of any bytes")
    }
}

/// A reply as Redis gives it to Lua (RESP2): integers as numbers, nil as `false`, arrays as
/// tables, a status as `{ok = ...}`, an error as `{err = ...}`.
fn to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Int(n) => Value::Number(*n as f64),
        Reply::BulkString(bytes) => Value::String(lua.create_string(bytes)?),
        Reply::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (at, item) in items.iter().enumerate() {
                table.raw_set(at + 1, to_lua(lua, item)?)?;
            }
            Value::Table(table)
        }
        Reply::Okay => Value::Table(tagged(lua, "ok", "OK")?),
        Reply::SimpleString(text) => Value::Table(tagged(lua, "ok", text)?),
        Reply::ServerError(error) => {
            let message = match error.details() {
                Some(details) => format!("{} {details}", error.code()),
                None => error.code().to_owned(),
            };
            Value::Table(tagged(lua, "err", &message)?)
        }
        _ => Value::Boolean(false),
    })
}

fn tagged(lua: &Lua, tag: &str, text: &str) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    table.raw_set(tag, text)?;
    Ok(table)
}

/// A script's result as Redis replies it: numbers truncated to integers, `false` as nil, `true`
/// as 1, a table with `err` an error and with `ok` a status, any other table an array of its
/// elements up to the first nil.
fn to_reply(value: &Value) -> Reply {
    match value {
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(n) => Reply::Int(*n),
        Value::Number(n) => Reply::Int(*n as i64),
        Value::String(text) => Reply::BulkString(text.as_bytes().to_vec()),
        Value::Table(table) => {
            if let Ok(Value::String(error)) = table.raw_get::<Value>("err") {
                return reply::error(&error.to_string_lossy());
            }
            if let Ok(Value::String(status)) = table.raw_get::<Value>("ok") {
                return match status.as_bytes().as_ref() {
                    b"OK" => Reply::Okay,
                    _ => Reply::SimpleString(status.to_string_lossy()),
                };
            }
            let items = (1..)
                .map_while(|at| match table.raw_get::<Value>(at) {
                    Ok(Value::Nil) | Err(_) => None,
                    Ok(item) => Some(to_reply(&item)),
                })
                .collect();
            Reply::Array(items)
        }
        _ => Reply::Nil,
    }
}

/// What a failed script replies: the error `redis.call` raised, with its code, or a Lua
/// error as `ERR`.
fn failure(error: &Value) -> String {
    match error {
        Value::Table(table) => match table.raw_get::<Value>("err") {
            Ok(Value::String(message)) => message.to_string_lossy(),
            _ => "ERR a script raised a table without `err`".into(),
        },
        Value::String(message) => format!("ERR {}", message.to_string_lossy()),
        other => format!("ERR {other:?}"),
    }
}
