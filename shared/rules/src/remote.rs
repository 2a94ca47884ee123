//! The rules API over gRPC (`strata.rules.v1`, with the `grpc` feature): [`RulesService`]
//! serves a tier's rules and alerts with its external labels on them; [`RemoteRules`] is
//! a global's client for one regional. What the global does with several answers is
//! [`crate::merge`].

use crate::api::{self, RulesFilter};
use crate::manager::RuleManager;
use serde_json::{json, Value};
use std::sync::Arc;
use strata_proto::rules as pb;
use strata_proto::rules::rules_client::RulesClient;
use strata_proto::rules::rules_server::{Rules, RulesServer};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The largest answer taken from a regional (every rule and alert of it, as JSON): some
/// 40,000 alerts. Parsed, an answer takes several times its size, so this bounds what one
/// hostile store can make a global hold.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Serves a tier's rules; with no rule files configured, empty lists.
#[derive(Clone)]
pub struct RulesService {
    manager: Option<Arc<RuleManager>>,
}

impl RulesService {
    pub fn new(manager: Option<Arc<RuleManager>>) -> Self {
        RulesService { manager }
    }

    pub fn into_server(self) -> RulesServer<Self> {
        RulesServer::new(self).max_encoding_message_size(MAX_ANSWER_BYTES)
    }
}

/// A request's filters as the HTTP API's query pairs, so both are read by one parser.
fn filter_of(r: pb::RulesRequest) -> Result<RulesFilter, Status> {
    let mut pairs = vec![("type".to_string(), r.r#type)];
    let lists =
        [("rule_name[]", r.rule_name), ("rule_group[]", r.rule_group), ("file[]", r.file), ("match[]", r.r#match)];
    for (key, values) in lists {
        pairs.extend(values.into_iter().map(|v| (key.to_string(), v)));
    }
    if r.exclude_alerts {
        pairs.push(("exclude_alerts".into(), "true".into()));
    }
    RulesFilter::from_pairs(&pairs).map_err(Status::invalid_argument)
}

/// The HTTP API's query pairs as a request (a global passes its filters on).
pub fn request_from_pairs(pairs: &[(String, String)]) -> pb::RulesRequest {
    let mut r = pb::RulesRequest::default();
    for (k, v) in pairs {
        match k.as_str() {
            "type" => r.r#type = v.clone(),
            "rule_name[]" => r.rule_name.push(v.clone()),
            "rule_group[]" => r.rule_group.push(v.clone()),
            "file[]" => r.file.push(v.clone()),
            "match[]" => r.r#match.push(v.clone()),
            "exclude_alerts" => r.exclude_alerts = matches!(v.as_str(), "true" | "1"),
            _ => {}
        }
    }
    r
}

fn encoded(data: &Value) -> Result<Vec<u8>, Status> {
    serde_json::to_vec(data).map_err(|e| Status::internal(format!("encoding the answer: {e}")))
}

#[tonic::async_trait]
impl Rules for RulesService {
    async fn rules(&self, req: Request<pb::RulesRequest>) -> Result<Response<pb::RulesResponse>, Status> {
        let filter = filter_of(req.into_inner())?;
        let data = match &self.manager {
            Some(m) => api::rules(m, &filter, m.external_labels()).await,
            None => json!({ "groups": [] }),
        };
        Ok(Response::new(pb::RulesResponse { data_json: encoded(&data)? }))
    }

    async fn alerts(&self, _req: Request<pb::AlertsRequest>) -> Result<Response<pb::AlertsResponse>, Status> {
        let data = match &self.manager {
            Some(m) => api::alerts(m, m.external_labels()).await,
            None => json!({ "alerts": [] }),
        };
        Ok(Response::new(pb::AlertsResponse { data_json: encoded(&data)? }))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteRulesError {
    /// The store serves no rules API (an edge, or another StoreAPI server).
    #[error("store {store} serves no rules")]
    Unimplemented { store: String },
    #[error("store {store}: rules API: {message}")]
    Failed { store: String, message: String },
}

/// One regional's rules API.
#[derive(Clone)]
pub struct RemoteRules {
    name: String,
    client: RulesClient<Channel>,
}

impl RemoteRules {
    /// Over `channel` (the store's StoreAPI connection: the same server serves both).
    pub fn new(name: &str, channel: Channel) -> Self {
        let client = RulesClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
        RemoteRules { name: name.to_string(), client }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn failed(&self, s: Status) -> RemoteRulesError {
        if s.code() == tonic::Code::Unimplemented {
            return RemoteRulesError::Unimplemented { store: self.name.clone() };
        }
        RemoteRulesError::Failed { store: self.name.clone(), message: format!("{:?}: {}", s.code(), s.message()) }
    }

    fn parsed(&self, bytes: &[u8]) -> Result<Value, RemoteRulesError> {
        serde_json::from_slice(bytes).map_err(|e| RemoteRulesError::Failed {
            store: self.name.clone(),
            message: format!("answer is not JSON: {e}"),
        })
    }

    pub async fn rules(&self, req: pb::RulesRequest) -> Result<Value, RemoteRulesError> {
        let mut c = self.client.clone();
        let answer = c.rules(req).await.map_err(|s| self.failed(s))?.into_inner();
        self.parsed(&answer.data_json)
    }

    pub async fn alerts(&self) -> Result<Value, RemoteRulesError> {
        let mut c = self.client.clone();
        let answer = c.alerts(pb::AlertsRequest {}).await.map_err(|s| self.failed(s))?.into_inner();
        self.parsed(&answer.data_json)
    }
}
