//! The Azure Cosmos DB store of Steadfast (work in progress: the REST
//! client's pieces land first).

pub mod auth;
