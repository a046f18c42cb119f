//! The agent: channels, branches, workers and the compactor, each an LLM turn loop with its
//! own prompt and the tool set its profile grants.
//!
//! - A channel ([`Runtime::send_user_message`]) talks to the user and only delegates:
//!   `reply`, `branch`, `spawn_worker`, `route`, `cancel`, `skip`.
//! - A branch forks the channel's history, thinks with memory, tasks and read-only files,
//!   and returns a conclusion.
//! - A worker gets a fresh prompt and a task, file and task tools, and `set_status`.
//! - The compactor summarizes a channel's oldest history when it passes its share of the
//!   context window.
//!
//! Branch and worker results re-trigger their channel (debounced, capped per user message)
//! so the user hears the outcome; a result that arrives after the branch that asked for it
//! ended is kept in working memory and told in a notification turn of its own. Every
//! prompt goes through [`crate::dispatch`].

mod audience;
mod branch;
mod channel;
mod compactor;
mod context;
mod conversations;
mod events;
mod exchange;
mod forwarding;
mod inbox;
mod model_gate;
mod notifications;
mod process_calls;
mod process_ids;
mod prompts;
mod repeats;
mod reporter;
mod reservations;
mod runtime;
mod spawning;
mod spill;
mod spilling;
mod stop;
mod supervisor;
mod tool_calls;
mod turn;
mod worker;
mod worker_records;

pub use conversations::{ConversationError, OwnedElsewhere};
pub use events::{ChatStep, Event, TurnEnding};
pub use exchange::{End, Exchange, PartNumber, ReplyPart, UserMessage};
pub use notifications::NotificationKind;
pub use spawning::SpawnOutcome;
pub use supervisor::{ShuttingDown, TooManyConversations};

pub use runtime::{Runtime, Sent};
pub use spill::SpillError;
pub use stop::{NotSaved, StopReport};
