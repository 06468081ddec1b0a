//! The kinds of storage request, as wrappers count, limit and fail them.

use std::fmt;

use crate::PutMode;

/// One kind of [`ObjectStore`](crate::ObjectStore) request. Create and update puts are apart
/// because they cost and fail differently (an update takes a lock or a conditional header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    PutCreate = 0,
    PutUpdate = 1,
    Get = 2,
    GetRange = 3,
    List = 4,
    Delete = 5,
}

impl OpKind {
    pub const COUNT: usize = 6;
    pub const ALL: [OpKind; OpKind::COUNT] = [
        OpKind::PutCreate,
        OpKind::PutUpdate,
        OpKind::Get,
        OpKind::GetRange,
        OpKind::List,
        OpKind::Delete,
    ];

    pub fn of_put(mode: &PutMode) -> Self {
        match mode {
            PutMode::Create => OpKind::PutCreate,
            PutMode::Update(_) => OpKind::PutUpdate,
        }
    }

    /// A stable lowercase name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::PutCreate => "put_create",
            OpKind::PutUpdate => "put_update",
            OpKind::Get => "get",
            OpKind::GetRange => "get_range",
            OpKind::List => "list",
            OpKind::Delete => "delete",
        }
    }

    pub fn is_put(self) -> bool {
        matches!(self, OpKind::PutCreate | OpKind::PutUpdate)
    }

    /// Position in per-kind arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
